"""Every deferred protocol model builds (docs/design/0470): with defer_build a model whose schema
cannot be made no longer fails at import but in the first session that uses it."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest
from pydantic import BaseModel

from corral.protocol import actions, results
from corral.sandbox.tools import transfer_record


def _models(*modules: ModuleType) -> list[type[BaseModel]]:
    return [
        obj
        for module in modules
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
    ]


@pytest.mark.parametrize("model", _models(actions, results, transfer_record), ids=lambda m: m.__qualname__)
def test_every_deferred_model_builds(model: type[BaseModel]) -> None:
    model.model_rebuild(force=True)  # raises what the first use would
    assert model.__pydantic_complete__
    model.model_json_schema()

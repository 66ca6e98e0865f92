from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from corral.sandbox.settings import ControllerSettings


def test_the_environment_names_each_field_with_the_prefix_in_any_case() -> None:
    settings = ControllerSettings.from_environ(
        {
            "CORRAL_RECORD": "false",
            "corral_port": "9000",
            "DISPLAY": ":5",
            "CORRAL_BROWSER_IDLE_STOP_S": "0",
            "CORRAL_SECRET_FILE": "/run/elsewhere",
            "CORRAL_SCREEN": "1024x768",  # the init's, not the controller's: ignored
            "HOME": "/home/corral",
        }
    )
    assert settings.record is False
    assert settings.port == 9000
    assert settings.display == ":5"
    assert settings.browser_idle_stop_s == 0.0
    assert settings.secret_file == Path("/run/elsewhere")
    assert ControllerSettings.from_environ({}) == ControllerSettings()


def test_a_bad_value_names_its_field_and_a_misspelt_keyword_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        ControllerSettings.from_environ({"CORRAL_PORT": "eighty"})
    assert caught.value.errors()[0]["loc"] == ("port",)
    with pytest.raises(ValidationError):
        ControllerSettings(recrod=False)  # type: ignore[call-arg]
    assert ControllerSettings(display=":3").display == ":3"


# ``python -m corral.sandbox.controller`` up to serving: its main, uvicorn's run stubbed out.
CONTROLLER_IMPORTS = (
    "uvicorn; uvicorn.run = lambda *args, **kwargs: None; import corral.sandbox.controller as c; c.main()"
)


def test_the_controller_imports_neither_fastapi_nor_pydantic_settings_nor_httpx() -> None:
    # Each is megabytes of every idle sandbox's memory (bench/gateway.py): the controller needs none.
    heavy = "{'fastapi', 'pydantic_settings', 'httpx'}"
    probe = f"import sys, {CONTROLLER_IMPORTS}; print(sorted({heavy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_controller_imports_playwrights_api_and_a_websocket_client_only_when_first_used() -> None:
    # Both are on every cold start's path otherwise (about 100 ms of the controller's boot, on the CPUs
    # Chromium is starting on; bench/cold.py): the driver starts on the first browser call, the
    # client on the first CDP connection.
    lazy = "{'playwright.async_api', 'websockets.asyncio.client'}"
    probe = f"import sys, {CONTROLLER_IMPORTS}; print(sorted({lazy} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_controller_serves_before_loading_the_dialects_vendors_or_tools_or_building_action_models() -> None:
    # About 110 ms of CPU on every cold start's path, beside Chromium's (docs/design/0470): the dialects'
    # and vendors' translators load on a request that speaks them, the agent's editor, patches, search
    # and shell on the first tool action, the action models and their one union validator on first
    # use (the lifespan's warm-up, in the app).
    lazy = (
        "{'corral.protocol.anthropic', 'corral.protocol.openai', 'corral.protocol.vendor.steps',"
        " 'corral.protocol.vendor.replies', 'corral.protocol.vendor.anthropic_tools',"
        " 'corral.protocol.vendor.openai_tools', 'corral.sandbox.tools.editor', 'corral.sandbox.tools.patch',"
        " 'corral.sandbox.tools.search', 'corral.sandbox.agent.shell'}"
    )
    built = "actions.native_action.cache_info().currsize, actions.Click.__pydantic_complete__"
    probe = (
        f"import sys, {CONTROLLER_IMPORTS}; from corral.protocol import actions;"
        f" print(sorted({lazy} & set(sys.modules)), {built})"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] 0 False"


def test_the_errors_the_controller_catches_before_playwrights_api_loads_are_the_ones_it_raises() -> None:
    # corral.sandbox.web's modules and desktop import them from Playwright's private module (its public one
    # loads the whole API): a Playwright that moved them would fail here, not in a sandbox.
    import playwright.async_api as api

    from corral.sandbox import desktop
    from corral.sandbox.web import browser, navigation

    assert browser.PlaywrightError is api.Error and desktop.PlaywrightError is api.Error
    assert navigation.PlaywrightTimeout is api.TimeoutError

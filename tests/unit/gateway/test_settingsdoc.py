"""docs/gateway.md's settings table is the settings model's: one row per setting, in order, with its
default and its description; a setting added, removed or changed fails here until the table is
generated again (`python -m corral.gateway.settingsdoc`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.gateway import settingsdoc
from corral.gateway.downloadsettings import DownloadSettings
from corral.gateway.environmentsettings import EnvironmentSettings
from corral.gateway.previewsettings import PreviewSettings
from corral.gateway.settings import GatewaySettings, env_name

DOC = Path(__file__).resolve().parents[3] / "docs" / "gateway.md"


def test_the_docs_table_is_the_one_the_model_generates() -> None:
    doc = DOC.read_text()
    assert settingsdoc.replaced(doc, settingsdoc.table()) == doc, (
        "docs/gateway.md's settings table and corral.gateway.settings disagree: "
        "run `python -m corral.gateway.settingsdoc`"
    )


def test_the_table_has_one_row_per_setting_each_with_a_meaning() -> None:
    rows = re.findall(r"^\| `(CORRAL_[A-Z0-9_]+)` \| (.+?) \| (.+) \|$", settingsdoc.table(), re.MULTILINE)
    # The gateway's own settings in their order, then its bases' (what may outlive a session, previews).
    inherited = {*EnvironmentSettings.model_fields, *PreviewSettings.model_fields, *DownloadSettings.model_fields}
    own = [field for field in GatewaySettings.model_fields if field not in inherited]
    based = [field for field in GatewaySettings.model_fields if field in inherited]
    assert set(based) == inherited
    assert [name for name, _, _ in rows] == [env_name(field) for field in [*own, *based]]
    assert all(meaning.strip() for _, _, meaning in rows)
    assert len(rows) == len(GatewaySettings.model_fields) == 84


def test_the_docs_hold_one_settings_table() -> None:
    """No second, hand-kept list of the settings beside the generated one."""
    doc = DOC.read_text()
    assert doc.count(settingsdoc.BEGIN) == 1
    assert doc.count("| `CORRAL_MAX_SESSIONS_PER_KEY` |") == 1


def test_defaults_are_shown_as_an_operator_writes_them() -> None:
    fields = GatewaySettings.model_fields
    shown = {name: settingsdoc.default_text(fields[name]) for name in ("record", "default_cpus", "api_key", "port")}
    assert shown == {"record": "`true`", "default_cpus": "unset", "api_key": "empty", "port": "`8700`"}
    assert settingsdoc.default_text(fields["data_dir"]) == "`~/.local/share/corral`"


def test_a_doc_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="markers are missing"):
        settingsdoc.replaced("# no table here\n", settingsdoc.table())


def test_main_rewrites_a_stale_table(tmp_path: Path) -> None:
    stale = tmp_path / "gateway.md"
    stale.write_text(f"before\n{settingsdoc.BEGIN}\n| old |\n{settingsdoc.END}\nafter\n")
    assert settingsdoc.main([str(stale)]) == 0
    assert stale.read_text() == f"before\n{settingsdoc.BEGIN}\n{settingsdoc.table()}\n{settingsdoc.END}\nafter\n"

"""docs/gateway.md's settings table, generated from :class:`GatewaySettings`: name, default, meaning.

The meanings are the fields' descriptions; ``python -m corral.gateway.settingsdoc`` rewrites the
table between its markers, and tests/unit/gateway/test_settingsdoc.py fails while the two disagree."""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic.fields import FieldInfo

from corral.gateway.downloadsettings import DownloadSettings
from corral.gateway.environmentsettings import EnvironmentSettings
from corral.gateway.previewsettings import PreviewSettings
from corral.gateway.settings import GatewaySettings, env_name

BEGIN = "<!-- settings table: generated from corral.gateway.settings by `python -m corral.gateway.settingsdoc` -->"
END = "<!-- end of the settings table -->"
DOC = Path(__file__).resolve().parents[3] / "docs" / "gateway.md"


def default_text(field: FieldInfo) -> str:
    """A default as an operator would write it in ``corral.env`` (the home directory as ``~``)."""
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, Path):
        home = Path.home()
        shown = f"~/{value.relative_to(home)}" if value.is_relative_to(home) else str(value)
        return f"`{shown}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def table() -> str:
    """One row per setting, in the order of the classes' declarations: the gateway's own, then what
    may outlive a session and previews' (its bases, :class:`EnvironmentSettings` and
    :class:`PreviewSettings`, whose fields pydantic lists first)."""
    rows = ["| setting | default | meaning |", "| --- | --- | --- |"]
    fields = GatewaySettings.model_fields
    inherited = {*EnvironmentSettings.model_fields, *PreviewSettings.model_fields, *DownloadSettings.model_fields}
    ordered = [name for name in fields if name not in inherited] + [name for name in fields if name in inherited]
    for name in ordered:
        field = fields[name]
        meaning = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{env_name(name)}` | {default_text(field)} | {meaning} |")
    return "\n".join(rows)


def replaced(doc: str, generated: str) -> str:
    """``doc`` with what lies between the markers replaced by ``generated``; ValueError without them."""
    head, begin, rest = doc.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"the settings table's markers are missing: {BEGIN!r} ... {END!r}")
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the table in docs/gateway.md (or the file given); says whether anything changed."""
    path = Path(argv[0]) if argv else DOC
    before = path.read_text()
    after = replaced(before, table())
    if after != before:
        path.write_text(after)
    print(f"{path}: {'rewritten' if after != before else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Downloads' shared names (corral.contracts.downloads): a sandbox-made name made safe to show and to
save under, the header that hands it over as an attachment, ids, and the one folder a path may name."""

from __future__ import annotations

import pytest

from corral.contracts import downloads as dl


@pytest.mark.parametrize(
    ("raw", "safe"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("..\\..\\boot.ini", "boot.ini"),
        ("", "download"),
        ("..", "download"),
        ("...", "download"),
        (".bashrc", "bashrc"),
        ("-rf", "rf"),
        ("a\x00b\nc.txt", "a_b_c.txt"),
        ("invoice\u202efdp.exe", "invoice_fdp.exe"),  # a right-to-left override: the extension shown lies
        ('a"b<c>|d*?.txt', "a_b_c__d__.txt"),
        ("caf\u0065\u0301.txt", "caf\u00e9.txt"),  # NFC
        ("trailing. ", "trailing"),
    ],
)
def test_a_name_is_made_safe(raw: str, safe: str) -> None:
    assert dl.safe_name(raw) == safe


def test_a_long_name_keeps_its_extension_within_the_bound() -> None:
    cut = dl.safe_name("x" * 500 + ".tar.gz")
    assert len(cut) <= dl.MAX_NAME_CHARS and cut.endswith(".gz")
    assert len(dl.safe_name("y" * 500)) == dl.MAX_NAME_CHARS


@pytest.mark.parametrize(
    ("name", "header"),
    [
        ("report.pdf", "attachment; filename=\"report.pdf\"; filename*=UTF-8''report.pdf"),
        ('we"ird;%.txt', "attachment; filename=\"we_ird__.txt\"; filename*=UTF-8''we_ird%3B%25.txt"),
        ("résumé.pdf", "attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"),
        (
            "a\r\nSet-Cookie: x=1",
            "attachment; filename=\"a__Set-Cookie__x=1\"; filename*=UTF-8''a__Set-Cookie_%20x%3D1",
        ),
    ],
)
def test_content_disposition_is_an_attachment_with_no_header_breaking_character(name: str, header: str) -> None:
    made = dl.content_disposition(name)
    assert made == header
    assert made.startswith("attachment;") and "\r" not in made and "\n" not in made and made.isascii()


@pytest.mark.parametrize(
    ("given", "problem"),
    [("c341624d-6c3a-4174-aff6-77bed4879276", False), ("", True), ("a/b", True), ("x" * 65, True), ("a b", True)],
)
def test_ids(given: str, problem: bool) -> None:
    assert (dl.id_problem(given) is not None) is problem


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/home/agent/Downloads/a.pdf", "a.pdf"),
        ("/home/agent/Downloads/a (1).pdf", "a (1).pdf"),
        ("/home/agent/Downloads/", None),
        ("/home/agent/Downloads/../.ssh/id", None),
        ("/home/agent/Downloads/sub/a", None),
        ("/home/agent/Downloads/..", None),
        ("/home/agent/DownloadsX/a", None),
        ("/etc/shadow", None),
        (None, None),
        (7, None),
        ("/home/agent/Downloads/" + "x" * 256, None),
    ],
)
def test_a_path_counts_only_directly_in_the_downloads_folder(path: object, name: str | None) -> None:
    assert dl.file_in_downloads(path) == name

"""The secrets scrubber's throughput, in process: ``Scrubber.scrub`` over a 10 MB text answer (HTML
and JSON as pages write them: entities, percent-escapes, ``\\uXXXX`` and ``\\n`` here and there), and
over 10 MB of prose with no escape at all, each with no secret in it and with one (the value plain
once, and once with some characters escaped), one secret loaded and 32. Median of ``--runs`` runs
of CPU time (``time.process_time``: on a machine other jobs share, it moves less than the wall
clock), MB/s.

Run it against two trees to compare them side by side (the scrubber is pure, stdlib only):

    PYTHONPATH=/work/main/services .venv/bin/python bench/scrub.py
    PYTHONPATH=$PWD/services .venv/bin/python bench/scrub.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from corral.proxy.secrets import Scrubber, Secret

SIZE = 10 * 1024 * 1024
VALUE = b"Sk_live/9f3c+A1b!x&<z-7e2d"
PLACEHOLDER = "corral_secret_" + "a" * 32

# A paragraph of a page as real servers write them: an HTML part and a JSON part.
_HTML = (
    b'<p class="item">Fish &amp; chips &lt;b&gt;caf&eacute;&lt;/b&gt; &#8212; price&nbsp;&#36;12 '
    b'<a href="/search?q=fish%20and%20chips&amp;page=2">next</a></p>\n'
)
_JSON = (
    b'{"id": 12345, "name": "caf\\u00e9 \\"Le Petit\\"", "note": "line one\\nline two",'
    b' "url": "https:\\/\\/x.test\\/a"}\n'
)


_PROSE = b"The quick brown fox jumps over the lazy dog, 12 times; then it rests (a while). " * 3 + b"\n"


def _text(with_value: bool, unit: bytes = _HTML + _JSON) -> bytes:
    body = bytearray(unit * (SIZE // len(unit)))
    if with_value:
        escaped = b"".join(b"&#%d;" % c if i % 3 == 0 else bytes([c]) for i, c in enumerate(VALUE))
        middle = len(body) // 2
        body[middle:middle] = b" plain:" + VALUE + b" escaped:" + escaped + b" "
    return bytes(body)


def _secrets(count: int) -> list[Secret]:
    secrets = [Secret("TOKEN", PLACEHOLDER, VALUE, (), ("header",))]
    for index in range(1, count):
        value = b"Other-%02d_value/+x!%06d" % (index, index * 7919)
        secrets.append(Secret(f"S{index}", "corral_secret_" + f"{index:032x}", value, (), ("header",)))
    return secrets


def _median_s(scrubber: Scrubber, data: bytes, runs: int) -> tuple[float, int]:
    times, found = [], 0
    for _ in range(runs):
        start = time.process_time()
        _, counts = scrubber.scrub(data)
        times.append(time.process_time() - start)
        found = sum(counts.values())
    return statistics.median(times), found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print(f"{'secrets':>7} {'answer':>22} {'cpu s':>9} {'MB/s':>7} {'scrubbed':>8}")
    for count in (1, 32):
        scrubber = Scrubber(_secrets(count))
        for label, with_value, unit in (
            ("pages, no value", False, _HTML + _JSON),
            ("pages, value twice", True, _HTML + _JSON),
            ("prose, no value", False, _PROSE),
            ("prose, value twice", True, _PROSE),
        ):
            data = _text(with_value, unit)
            seconds, found = _median_s(scrubber, data, args.runs)
            print(f"{count:>7} {label:>22} {seconds:>9.3f} {len(data) / seconds / 1e6:>7.1f} {found:>8}")


if __name__ == "__main__":
    main()

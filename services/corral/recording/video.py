"""A recording as a video: its frames at the recorded timing, as MP4 (H.264) or WebM (VP8).

ffmpeg comes from the imageio-ffmpeg wheel (a static build inside the package), called with an
argument list; frames are handed to it as PNG through an ffconcat list with each frame's duration.
"""

from __future__ import annotations

import io
import subprocess
import tempfile
from pathlib import Path

from PIL import Image

from corral.recording.bundle import Bundle, BundleError

LAST_FRAME_S = 1.0
MIN_FRAME_S = 0.04
CODECS = {".mp4": ["-c:v", "libx264", "-pix_fmt", "yuv420p"], ".webm": ["-c:v", "libvpx", "-b:v", "1M"]}


def frame_durations(bundle: Bundle) -> list[tuple[bytes, float]]:
    """Each action's frame and how long it stays on screen: until the next action started."""
    shown = [(event, bundle.frame(event)) for event in bundle.actions]
    framed = [(event, data) for event, data in shown if data is not None]
    out = []
    for index, (event, data) in enumerate(framed):
        start = float(event.get("frame_at") or event.get("started") or 0)
        if index + 1 < len(framed):
            following = framed[index + 1][0]
            end = float(following.get("frame_at") or following.get("started") or start)
            duration = max(MIN_FRAME_S, end - start)
        else:
            duration = LAST_FRAME_S
        out.append((data, duration))
    return out


def export(bundle: Bundle, target: Path) -> float:
    """Write the video; returns its length in seconds. Raises BundleError or RuntimeError."""
    import imageio_ffmpeg

    codec = CODECS.get(target.suffix.lower())
    if codec is None:
        raise ValueError(f"the video must end in {' or '.join(CODECS)}, not {target.name!r}")
    frames = frame_durations(bundle)
    if not frames:
        raise BundleError(f"{bundle.source}: no frames to make a video of")
    with tempfile.TemporaryDirectory(prefix="corral-video-") as tmp:
        lines = ["ffconcat version 1.0"]
        for index, (data, duration) in enumerate(frames):
            name = f"{index:06d}.png"
            Image.open(io.BytesIO(data)).convert("RGB").save(Path(tmp) / name)
            lines += [f"file {name}", f"duration {duration:.3f}"]
        # The concat demuxer drops the last entry's duration unless the file is listed once more; then
        # the repeat adds a duration of its own, so the output is cut at the total.
        lines.append(f"file {len(frames) - 1:06d}.png")
        total = sum(duration for _, duration in frames)
        listing = Path(tmp) / "frames.ffconcat"
        listing.write_text("\n".join(lines) + "\n")
        argv = [
            imageio_ffmpeg.get_ffmpeg_exe(),
            "-hide_banner",
            "-loglevel",
            "error",
            "-y",
            "-f",
            "concat",
            "-safe",
            "0",
            "-i",
            str(listing),
            "-vf",
            "fps=10,scale=trunc(iw/2)*2:trunc(ih/2)*2",
            "-t",
            f"{total:.3f}",
            *codec,
            str(target),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"ffmpeg failed: {done.stderr.strip()[-500:]}")
    return total

"""Screen capture through MIT-SHM (one ``XShmGetImage`` into shared memory: about 1 ms per frame).

A CDP screenshot costs 50-100 ms and ``scrot`` about 70 ms; this reads the
framebuffer the X server already has. The pointer is not in the framebuffer,
so it is composited from XFixes when asked for.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

_ZPIXMAP = 2
_ALL_PLANES = ctypes.c_ulong(0xFFFFFFFF)
_IPC_PRIVATE = 0
_IPC_CREAT = 0o1000
_IPC_RMID = 0
_MADV_REMOVE = 9  # frees a shmem range and its backing store


class _XShmSegmentInfo(ctypes.Structure):
    _fields_ = [
        ("shmseg", ctypes.c_ulong),
        ("shmid", ctypes.c_int),
        ("shmaddr", ctypes.c_void_p),
        ("readOnly", ctypes.c_int),
    ]


class _XImage(ctypes.Structure):
    _fields_ = [
        ("width", ctypes.c_int),
        ("height", ctypes.c_int),
        ("xoffset", ctypes.c_int),
        ("format", ctypes.c_int),
        ("data", ctypes.c_void_p),
        ("byte_order", ctypes.c_int),
        ("bitmap_unit", ctypes.c_int),
        ("bitmap_bit_order", ctypes.c_int),
        ("bitmap_pad", ctypes.c_int),
        ("depth", ctypes.c_int),
        ("bytes_per_line", ctypes.c_int),
        ("bits_per_pixel", ctypes.c_int),
        ("red_mask", ctypes.c_ulong),
        ("green_mask", ctypes.c_ulong),
        ("blue_mask", ctypes.c_ulong),
    ]


class _XFixesCursorImage(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_short),
        ("y", ctypes.c_short),
        ("width", ctypes.c_ushort),
        ("height", ctypes.c_ushort),
        ("xhot", ctypes.c_ushort),
        ("yhot", ctypes.c_ushort),
        ("cursor_serial", ctypes.c_ulong),
        ("pixels", ctypes.POINTER(ctypes.c_ulong)),
        ("atom", ctypes.c_ulong),
        ("name", ctypes.c_char_p),
    ]


def _load(name: str) -> ctypes.CDLL:
    path = ctypes.util.find_library(name)
    if path is None:
        raise OSError(f"lib{name} not found")
    return ctypes.CDLL(path)


@dataclass(frozen=True, slots=True)
class Frame:
    """One captured screen: ``data`` is BGRX, ``stride`` bytes per row (a bytearray: a live view's
    frame, valid until its next grab; corral.sandbox.display.screen.Screen.changed_frame)."""

    width: int
    height: int
    stride: int
    data: bytes | bytearray


@dataclass(frozen=True, slots=True)
class CursorImage:
    """The pointer's shape (premultiplied BGRA bytes) and where its top-left corner is on the screen."""

    x: int
    y: int
    width: int
    height: int
    bgra: bytes


class ShmCapture:
    """Grabs the root window with MIT-SHM. Not thread-safe: use from one thread."""

    def __init__(self, display_name: str) -> None:
        self._x11 = _load("X11")
        self._xext = _load("Xext")
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._xfixes: ctypes.CDLL | None
        try:
            self._xfixes = _load("Xfixes")
        except OSError:
            self._xfixes = None
        self._declare()
        self._dpy = self._x11.XOpenDisplay(display_name.encode())
        if not self._dpy:
            raise OSError(f"cannot open X display {display_name}")
        if not self._xext.XShmQueryExtension(self._dpy):
            self._x11.XCloseDisplay(self._dpy)
            raise OSError(f"X server {display_name} has no MIT-SHM extension")
        screen = self._x11.XDefaultScreen(self._dpy)
        self._root = self._x11.XRootWindow(self._dpy, screen)
        self.width = int(self._x11.XDisplayWidth(self._dpy, screen))
        self.height = int(self._x11.XDisplayHeight(self._dpy, screen))
        visual = self._x11.XDefaultVisual(self._dpy, screen)
        depth = self._x11.XDefaultDepth(self._dpy, screen)
        self._shm = _XShmSegmentInfo()
        image = self._xext.XShmCreateImage(
            self._dpy, visual, depth, _ZPIXMAP, None, ctypes.byref(self._shm), self.width, self.height
        )
        if not image:
            raise OSError("XShmCreateImage failed")
        self._image = ctypes.cast(image, ctypes.POINTER(_XImage))
        if self._image.contents.bits_per_pixel != 32:
            raise OSError(f"unsupported screen depth: {self._image.contents.bits_per_pixel} bits per pixel")
        self.stride = int(self._image.contents.bytes_per_line)
        self._size = self.stride * self.height
        shmid = self._libc.shmget(_IPC_PRIVATE, self._size, _IPC_CREAT | 0o600)
        if shmid < 0:
            raise OSError(ctypes.get_errno(), "shmget failed")
        addr = self._libc.shmat(shmid, None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "shmat failed")
        self._shm.shmid = shmid
        self._shm.shmaddr = addr
        self._shm.readOnly = 0
        self._image.contents.data = addr
        if not self._xext.XShmAttach(self._dpy, ctypes.byref(self._shm)):
            raise OSError("XShmAttach failed")
        self._x11.XSync(self._dpy, 0)
        # Marked for removal now, freed by the kernel once both sides detach (even if we crash).
        self._libc.shmctl(shmid, _IPC_RMID, None)

    def _declare(self) -> None:
        x11, xext, libc = self._x11, self._xext, self._libc
        x11.XOpenDisplay.restype = ctypes.c_void_p
        x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
        x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
        x11.XDefaultScreen.argtypes = [ctypes.c_void_p]
        x11.XRootWindow.restype = ctypes.c_ulong
        x11.XRootWindow.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XDisplayWidth.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XDisplayHeight.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XDefaultVisual.restype = ctypes.c_void_p
        x11.XDefaultVisual.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XDefaultDepth.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XSync.argtypes = [ctypes.c_void_p, ctypes.c_int]
        x11.XFree.argtypes = [ctypes.c_void_p]
        xext.XShmQueryExtension.argtypes = [ctypes.c_void_p]
        xext.XShmCreateImage.restype = ctypes.c_void_p
        xext.XShmCreateImage.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_uint,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_uint,
            ctypes.c_uint,
        ]
        xext.XShmAttach.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        xext.XShmDetach.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        xext.XShmGetImage.argtypes = [
            ctypes.c_void_p,
            ctypes.c_ulong,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_ulong,
        ]
        libc.shmget.restype = ctypes.c_int
        libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
        libc.shmat.restype = ctypes.c_void_p
        libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        libc.shmdt.argtypes = [ctypes.c_void_p]
        libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.memcmp.restype = ctypes.c_int
        libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        libc.memmove.restype = ctypes.c_void_p
        libc.memmove.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        if self._xfixes is not None:
            self._xfixes.XFixesGetCursorImage.restype = ctypes.POINTER(_XFixesCursorImage)
            self._xfixes.XFixesGetCursorImage.argtypes = [ctypes.c_void_p]

    def release(self) -> None:
        """Hand the shared segment's pages back: they are one shmem object with the X server's side, so
        both sides' copies of the last frame go (about 4 MiB of an idle sandbox, 1280x800). The next
        grab faults them in again."""
        if self._libc.madvise(self._shm.shmaddr, self._size, _MADV_REMOVE) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_REMOVE) failed")

    def grab(self) -> Frame:
        """The whole screen, copied out of the shared segment."""
        if not self._xext.XShmGetImage(self._dpy, self._root, self._image, 0, 0, _ALL_PLANES):
            raise OSError("XShmGetImage failed")
        return Frame(self.width, self.height, self.stride, ctypes.string_at(self._shm.shmaddr, self._size))

    def grab_if_changed(self, last: bytearray) -> bool:
        """Grabs the screen into ``last`` when it differs from it; whether it did. ``last`` of another
        size (empty: no frame yet) is resized and filled. The compare and the copy run in libc, off
        the GIL: a live view's poll must not hold up the controller's other work."""
        if not self._xext.XShmGetImage(self._dpy, self._root, self._image, 0, 0, _ALL_PLANES):
            raise OSError("XShmGetImage failed")
        fresh = len(last) != self._size
        if fresh:
            last[:] = bytes(self._size)
        target = (ctypes.c_char * self._size).from_buffer(last)
        try:
            if not fresh and self._libc.memcmp(target, self._shm.shmaddr, self._size) == 0:
                return False
            self._libc.memmove(target, self._shm.shmaddr, self._size)
            return True
        finally:
            del target  # releases the export: ``last`` may be resized again

    def cursor(self) -> CursorImage | None:
        """The pointer's current image, or None without XFixes."""
        if self._xfixes is None:
            return None
        ptr = self._xfixes.XFixesGetCursorImage(self._dpy)
        if not ptr:
            return None
        try:
            img = ptr.contents
            count = int(img.width) * int(img.height)
            # XFixes hands out one ARGB pixel per C long; keep the low 32 bits as little-endian BGRA.
            longs = (ctypes.c_ulong * count).from_address(ctypes.addressof(img.pixels.contents))
            argb = bytearray(count * 4)
            for i, value in enumerate(longs):
                argb[i * 4 : i * 4 + 4] = (value & 0xFFFFFFFF).to_bytes(4, "little")
            return CursorImage(
                int(img.x) - int(img.xhot), int(img.y) - int(img.yhot), int(img.width), int(img.height), bytes(argb)
            )
        finally:
            self._x11.XFree(ptr)

    def close(self) -> None:
        if self._dpy:
            self._xext.XShmDetach(self._dpy, ctypes.byref(self._shm))
            self._libc.shmdt(self._shm.shmaddr)
            self._x11.XCloseDisplay(self._dpy)
            self._dpy = None

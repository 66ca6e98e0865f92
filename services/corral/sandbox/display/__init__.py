"""The screen and input: X input and capture, who may use the X server, encoding, the clipboard."""

"""A WAV file made on the spot (16 kHz mono, 16-bit), for the audio routes' tests."""

from __future__ import annotations

import io
import wave


def wav(seconds: float = 1.5, sample: bytes = b"\x01\x00") -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(sample * int(16000 * seconds))
    return out.getvalue()

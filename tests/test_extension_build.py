"""The built extension shares torch's C++ runtime: specops._C binds the C++ runtime's
symbols (exceptions, stream formatting) to the shared libstdc++ that torch loads, never to
a static copy inside itself. A copy of its own crashed the process on an H200 image whose
g++ links libstdc++ statically: every integer the extension streamed (c10::str) and every
error it raised through pybind11 (setup.py's _shared_cxx_runtime now links the shared one).
Marked gpu as well, so that the GPU pass checks the extension built there."""

from __future__ import annotations

import ctypes
import sys

import pytest

import specops._C

# __cxa_throw raises every C++ exception; std::ostream::_M_insert<unsigned long> streams an
# integer (the frame the crash was in).
RUNTIME_SYMBOLS = ["__cxa_throw", "_ZNSo9_M_insertImEERSoT_"]


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _defining_file(handle: ctypes.CDLL, symbol: str) -> str:
    """The file whose definition of ``symbol`` a lookup from the extension finds (the
    extension itself first, then the libraries it needs)."""
    address = ctypes.cast(getattr(handle, symbol), ctypes.c_void_p).value
    info = _DlInfo()
    libc = ctypes.CDLL(None)
    assert libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) != 0, symbol
    return info.dli_fname.decode()


@pytest.mark.gpu
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects")
@pytest.mark.parametrize("symbol", RUNTIME_SYMBOLS)
def test_extension_binds_the_shared_cpp_runtime(symbol):
    handle = ctypes.CDLL(specops._C.__file__)
    where = _defining_file(handle, symbol)
    assert "libstdc++.so" in where, f"{symbol} is defined in {where}, not in a shared libstdc++"

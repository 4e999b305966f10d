"""CPU: the registers report (frost/kernels/resources.py) finds the device code in an exported
object and reads cuobjdump's usage lines (a stand-in tool here: CI has no cuobjdump)."""
from __future__ import annotations

import stat

import pytest

from frost.kernels import resources

_TOOL = """#!/bin/sh
# answers like cuobjdump -res-usage only for a file that starts with an ELF header of device code
head -c 12 "$2" | grep -q DEVCODE && printf ' Function k:\\n  REG:168 STACK:24 SHARED:0\\n Function j:\\n  REG:40 STACK:0\\n'
exit 0
"""


@pytest.mark.L0
def test_usage_is_read_from_the_embedded_device_image(tmp_path):
    tool = tmp_path / "cuobjdump"
    tool.write_text(_TOOL)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    host_header, decoy = b"\x7fELF host object", b"\x7fELF fatbin wrapper"
    payload = host_header + b"..." + decoy + b"..." + b"\x7fELFDEVCODE cubin bytes"
    assert resources.usage_of_object(payload, str(tool)) == [(168, 24), (40, 0)]
    assert resources.usage_of_object(host_header + b"no device image", str(tool)) == []

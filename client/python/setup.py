"""Generates the tandem.v1 stubs before packaging when they are missing or
older than proto/ (a checkout not yet built with CMake); metadata lives in
pyproject.toml."""

import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tandem import _gen  # noqa: E402  (standard library only)

if _gen.proto_files(_gen.DEFAULT_PROTO_ROOT):
    if _gen.is_stale():
        _gen.generate()
elif not _gen.stubs_present():
    sys.exit("tandem: the generated stubs (tandem/v1/*_pb2.py) are missing "
             "and proto/ is not at %s; install from a repository checkout"
             % _gen.DEFAULT_PROTO_ROOT)

setup()

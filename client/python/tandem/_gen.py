"""Generates the protobuf and gRPC stubs of ``tandem.v1`` into this package.

The stubs live in ``tandem/v1/`` next to this file (``tandem/v1/job_pb2.py``,
``tandem/v1/job_service_pb2_grpc.py``, ...). protoc writes imports such as
``from tandem.v1 import graph_pb2``, and since this package is named
``tandem`` those resolve to ``tandem.v1`` without any sys.path tricks.

The files are generated, not committed (.gitignore). Three things produce
them, all running the same protoc command:

- the CMake build (target ``tandem_python_stubs`` in client/CMakeLists.txt,
  part of ``all``, so ``scripts/setup.sh`` makes them);
- ``python3 -m tandem._gen`` from ``client/python`` (this module);
- ``setup.py`` when pip installs the package from a checkout without them.

Only the standard library is used here, so this runs before anything else of
the package can be imported.
"""

import argparse
import os
import shutil
import subprocess
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_ROOT = os.path.dirname(PACKAGE_DIR)  # client/python
STUB_DIR = os.path.join(PACKAGE_DIR, "v1")
# client/python/tandem -> repository root -> proto/
DEFAULT_PROTO_ROOT = os.path.normpath(
    os.path.join(PACKAGE_DIR, os.pardir, os.pardir, os.pardir, "proto"))
GRPC_PLUGIN = "/usr/bin/grpc_python_plugin"

INIT_TEXT = ('"""Generated protobuf and gRPC stubs of tandem.v1 '
             '(see tandem/_gen.py); do not edit."""\n')


def proto_files(proto_root):
    """The .proto files of tandem.v1, relative to proto_root, sorted."""
    d = os.path.join(proto_root, "tandem", "v1")
    if not os.path.isdir(d):
        return []
    return sorted("tandem/v1/" + f for f in os.listdir(d) if f.endswith(".proto"))


def expected_outputs(proto_root):
    out = [os.path.join(STUB_DIR, "__init__.py")]
    for p in proto_files(proto_root):
        base = os.path.basename(p)[:-len(".proto")]
        out.append(os.path.join(STUB_DIR, base + "_pb2.py"))
        out.append(os.path.join(STUB_DIR, base + "_pb2_grpc.py"))
    return out


def stubs_present():
    return os.path.isfile(os.path.join(STUB_DIR, "job_service_pb2.py")) and \
        os.path.isfile(os.path.join(STUB_DIR, "job_service_pb2_grpc.py"))


def is_stale(proto_root=DEFAULT_PROTO_ROOT):
    """True when a stub is missing or older than a .proto it comes from."""
    protos = proto_files(proto_root)
    if not protos:
        return not stubs_present()
    newest = max(os.path.getmtime(os.path.join(proto_root, p)) for p in protos)
    for out in expected_outputs(proto_root):
        if not os.path.isfile(out) or (not out.endswith("__init__.py") and
                                       os.path.getmtime(out) < newest):
            return True
    return False


def find_plugin():
    if os.path.isfile(GRPC_PLUGIN):
        return GRPC_PLUGIN
    return shutil.which("grpc_python_plugin")


def generate(proto_root=DEFAULT_PROTO_ROOT, protoc=None, plugin=None,
             out_root=PYTHON_ROOT, quiet=False):
    """Runs protoc over proto_root/tandem/v1/*.proto into out_root/tandem/v1."""
    protos = proto_files(proto_root)
    if not protos:
        raise RuntimeError(
            "no .proto files under %s/tandem/v1; pass --proto-root (the "
            "repository's proto/ folder)" % proto_root)
    protoc = protoc or shutil.which("protoc")
    plugin = plugin or find_plugin()
    if not protoc or not plugin:
        raise RuntimeError(
            "protoc and grpc_python_plugin are needed to generate the stubs; "
            "install the Debian packages protobuf-compiler and "
            "protobuf-compiler-grpc (scripts/setup.sh does)")
    os.makedirs(os.path.join(out_root, "tandem", "v1"), exist_ok=True)
    cmd = [protoc, "--proto_path=" + proto_root,
           "--python_out=" + out_root,
           "--grpc_python_out=" + out_root,
           "--plugin=protoc-gen-grpc_python=" + plugin] + protos
    subprocess.run(cmd, check=True, cwd=proto_root)
    with open(os.path.join(out_root, "tandem", "v1", "__init__.py"), "w") as f:
        f.write(INIT_TEXT)
    if not quiet:
        print("tandem: generated %d stubs of tandem.v1 into %s" %
              (2 * len(protos), os.path.join(out_root, "tandem", "v1")))


def ensure(proto_root=DEFAULT_PROTO_ROOT, quiet=True):
    """Generates the stubs when missing or stale and the protos are at hand."""
    if proto_files(proto_root) and is_stale(proto_root):
        generate(proto_root, quiet=quiet)
    return stubs_present()


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python3 -m tandem._gen",
        description="Generate tandem.v1 protobuf/gRPC stubs into the "
                    "tandem package (tandem/v1/).")
    ap.add_argument("--proto-root", default=DEFAULT_PROTO_ROOT,
                    help="folder holding tandem/v1/*.proto (default: %(default)s)")
    ap.add_argument("--protoc", default=None, help="protoc binary")
    ap.add_argument("--plugin", default=None, help="grpc_python_plugin binary")
    ap.add_argument("--if-stale", action="store_true",
                    help="do nothing when the stubs are newer than the protos")
    args = ap.parse_args(argv)
    if args.if_stale and not is_stale(args.proto_root):
        return 0
    try:
        generate(args.proto_root, args.protoc, args.plugin)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print("tandem._gen: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

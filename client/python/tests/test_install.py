"""The package installs with one pip command, offline, and its console
script runs."""

import importlib.util
import os
import subprocess
import sys

import pytest

from tandem_harness import PY_ROOT


@pytest.mark.skipif(importlib.util.find_spec("pip") is None,
                    reason="pip is not installed for this python (Debian: "
                           "python3-pip; scripts/setup.sh installs it)")
def test_pip_install_offline_gives_a_working_tandem_command(tmp_path):
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps",
         "--no-build-isolation", "--no-index", "--quiet",
         "--disable-pip-version-check", "--target", str(target),
         str(PY_ROOT)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "tandem" / "v1" / "job_service_pb2_grpc.py").is_file()
    # The exporter is a package of its own; the version comes from
    # tandem/__init__.py, its one place.
    assert (target / "tandem" / "export" / "glue.py").is_file()
    import tandem
    dist = list(target.glob("tandem-*.dist-info"))
    assert [d.name for d in dist] == [
        "tandem-%s.dist-info" % tandem.__version__]
    script = target / "bin" / "tandem"
    assert script.is_file()
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([str(script), "--help"], capture_output=True,
                       text=True, env=env, cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "submit" in r.stdout
    r = subprocess.run(
        [sys.executable, "-c",
         "import tandem, tandem.v1.job_pb2 as j; print(tandem.__file__); "
         "print(tandem.Client, j.JobSpec)"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(str(target))

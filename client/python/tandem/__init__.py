"""Tandem's Python client: submit, watch and steer training jobs on a tandem
coordinator.

    import tandem
    client = tandem.Client("127.0.0.1:50051")
    job = client.submit("job.yaml")

    tandem.export(model, example_batch, path="model.tandem")   # needs torch

The protobuf stubs live in ``tandem.v1`` (generated; see ``tandem._gen``).
Names that need them are imported on first use, so ``python3 -m tandem._gen``
runs even before they exist.
"""

from tandem.errors import SpecError, TandemError

__version__ = "0.1.0"

_LAZY = {
    "Client": "tandem.client",
    "JobStatus": "tandem.client",
    "ScheduleResult": "tandem.client",
    "Explanation": "tandem.client",
    "Decision": "tandem.client",
    "Binding": "tandem.client",
    "DEFAULT_ADDRESS": "tandem.client",
    "state_name": "tandem.client",
    "is_terminal": "tandem.client",
    "load_spec_file": "tandem.spec",
    "spec_from_dict": "tandem.spec",
    "spec_to_dict": "tandem.spec",
    "spec_to_yaml": "tandem.spec",
    # Model export needs torch, imported only when these are first used.
    "export": "tandem.export",
    "ExportError": "tandem.export",
    "ArchiveError": "tandem.export",
    "load_archive": "tandem.export",
    "run_archive": "tandem.export",
    # Weight files: the standard library only.
    "export_weights": "tandem.weights",
    "read_weights": "tandem.weights",
    "read_safetensors": "tandem.weights",
}

__all__ = ["TandemError", "SpecError"] + sorted(_LAZY)


def _missing_stubs_error(err):
    return ImportError(
        "tandem's generated protobuf stubs (tandem/v1/*_pb2.py) are missing "
        "(%s). Build the project with CMake (scripts/setup.sh; target "
        "tandem_python_stubs), or run `python3 -m tandem._gen` in "
        "client/python, then reinstall." % err)


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError("module 'tandem' has no attribute %r" % name)
    import importlib
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("tandem.v1"):
            raise _missing_stubs_error(e) from None
        raise
    # tandem.export is the module itself, callable as export().
    value = mod if name == "export" else getattr(mod, name)
    globals()[name] = value
    return value

"""Job specs: YAML (or a dict) to ``tandem.v1.JobSpec`` and back.

The conversion walks the protobuf descriptor of ``JobSpec``, so the accepted
keys are exactly the fields of proto/tandem/v1/job.proto: add a field there and
it is accepted here with no change. Checks done locally are about shape only
(unknown keys, wrong types); the coordinator applies defaults and checks the
values, returning field-level messages.
"""

import difflib
import math
import os
import re

import yaml
from google.protobuf.descriptor import FieldDescriptor as FD

from tandem.errors import SpecError
from tandem.v1 import job_pb2

_INT_TYPES = {
    FD.TYPE_INT32: (-(2 ** 31), 2 ** 31 - 1),
    FD.TYPE_SINT32: (-(2 ** 31), 2 ** 31 - 1),
    FD.TYPE_SFIXED32: (-(2 ** 31), 2 ** 31 - 1),
    FD.TYPE_UINT32: (0, 2 ** 32 - 1),
    FD.TYPE_FIXED32: (0, 2 ** 32 - 1),
    FD.TYPE_INT64: (-(2 ** 63), 2 ** 63 - 1),
    FD.TYPE_SINT64: (-(2 ** 63), 2 ** 63 - 1),
    FD.TYPE_SFIXED64: (-(2 ** 63), 2 ** 63 - 1),
    FD.TYPE_UINT64: (0, 2 ** 64 - 1),
    FD.TYPE_FIXED64: (0, 2 ** 64 - 1),
}
_FLOAT_TYPES = (FD.TYPE_DOUBLE, FD.TYPE_FLOAT)

# Friendlier spellings of enum values, by enum full name.
_ENUM_ALIASES = {
    "tandem.v1.DType": {
        "float32": "F32", "fp32": "F32",
        "bfloat16": "BF16",
        "float16": "F16", "fp16": "F16", "half": "F16",
    },
}

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2,
    "g": 1000 ** 3, "gb": 1000 ** 3, "t": 1000 ** 4, "tb": 1000 ** 4,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*$")


# ---------------------------------------------------------------- enums

def enum_prefix(enum_desc):
    """The common prefix of an enum's value names, e.g. ``DTYPE_``."""
    names = [v.name for v in enum_desc.values]
    prefix = os.path.commonprefix(names)
    return prefix[:prefix.rfind("_") + 1] if "_" in prefix else ""


def enum_short_name(enum_desc, number):
    """``DTYPE_BF16`` → ``bf16``; unknown numbers print as the number."""
    v = enum_desc.values_by_number.get(number)
    if v is None:
        return str(number)
    return v.name[len(enum_prefix(enum_desc)):].lower()


def enum_choices(enum_desc):
    """Short names a user may write, without the UNSPECIFIED zero value."""
    return [enum_short_name(enum_desc, v.number) for v in enum_desc.values
            if not v.name.endswith("_UNSPECIFIED")]


def parse_enum(enum_desc, value, path="value"):
    """Parses ``bf16``, ``BF16``, ``DTYPE_BF16`` or an alias into a number."""
    choices = enum_choices(enum_desc)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SpecError("%s: expected one of %s, got %r" %
                        (path, ", ".join(choices), value), path)
    if isinstance(value, int):
        if value in enum_desc.values_by_number:
            return value
        raise SpecError("%s: expected one of %s, got %r" %
                        (path, ", ".join(choices), value), path)
    text = value.strip()
    key = text.lower()
    alias = _ENUM_ALIASES.get(enum_desc.full_name, {}).get(key)
    prefix = enum_prefix(enum_desc)
    candidates = [text.upper(), prefix + text.upper()]
    if alias:
        candidates.insert(0, prefix + alias)
    for name in candidates:
        v = enum_desc.values_by_name.get(name)
        if v is not None and not v.name.endswith("_UNSPECIFIED"):
            return v.number
    # Near misses only: f64 is no typo of f16.
    close = difflib.get_close_matches(key, [c.lower() for c in choices], n=1,
                                      cutoff=0.75)
    hint = " (did you mean '%s'?)" % close[0] if close else ""
    raise SpecError("%s: expected one of %s, got %r%s" %
                    (path, ", ".join(choices), value, hint), path)


# ---------------------------------------------------------------- scalars

def _describe(value):
    return repr(value) if isinstance(value, str) else \
        ("a list" if isinstance(value, list) else
         "a mapping" if isinstance(value, dict) else repr(value))


def _parse_int(field, value, path):
    lo, hi = _INT_TYPES[field.type]
    out = None
    if isinstance(value, bool):
        out = None
    elif isinstance(value, int):
        out = value
    elif isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            out = int(value)
    elif isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            out = int(text)
        except ValueError:
            try:
                f = float(text)
                if math.isfinite(f) and f.is_integer():
                    out = int(f)
            except ValueError:
                pass
        if out is None and field.name.endswith("_bytes"):
            m = _SIZE_RE.match(value)
            if m and m.group(2).lower() in _SIZE_UNITS:
                out = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if out is None:
        hint = " (a size such as 8GiB or 512MiB)" if \
            field.name.endswith("_bytes") else ""
        raise SpecError("%s: expected an integer%s, got %s" %
                        (path, hint, _describe(value)), path)
    if not lo <= out <= hi:
        raise SpecError("%s: %d is out of range [%d, %d]" % (path, out, lo, hi),
                        path)
    return out


def _parse_float(value, path):
    if isinstance(value, bool):
        pass
    elif isinstance(value, (int, float)):
        return float(value)
    elif isinstance(value, str):
        # PyYAML reads 3e-4 (no dot) as a string; accept it as a number.
        try:
            return float(value.strip().replace("_", ""))
        except ValueError:
            pass
    raise SpecError("%s: expected a number, got %s" % (path, _describe(value)),
                    path)


def _parse_scalar(field, value, path):
    if field.type in _INT_TYPES:
        return _parse_int(field, value, path)
    if field.type in _FLOAT_TYPES:
        return _parse_float(value, path)
    if field.type == FD.TYPE_BOOL:
        if isinstance(value, bool):
            return value
        raise SpecError("%s: expected true or false, got %s" %
                        (path, _describe(value)), path)
    if field.type == FD.TYPE_STRING:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise SpecError("%s: expected a string, got %r (quote it: \"%s\")" %
                            (path, value, value), path)
        raise SpecError("%s: expected a string, got %s" %
                        (path, _describe(value)), path)
    if field.type == FD.TYPE_BYTES:
        if isinstance(value, bytes):
            return value
        if isinstance(value, str):
            return value.encode()
        raise SpecError("%s: expected a string, got %s" %
                        (path, _describe(value)), path)
    if field.type == FD.TYPE_ENUM:
        return parse_enum(field.enum_type, value, path)
    raise SpecError("%s: fields of this type cannot be set from YAML" % path,
                    path)


# ---------------------------------------------------------------- messages

def _keys_of(desc):
    return [f.name for f in desc.fields]


def _fill(msg, data, prefix, errors):
    """Fills `msg` from `data`; every problem found goes to `errors` (a
    list of SpecError) and the rest is still read, so that one run names
    them all."""
    desc = msg.DESCRIPTOR
    where = prefix or "the job spec"
    if not isinstance(data, dict):
        errors.append(SpecError(
            "%s: expected a mapping with keys %s, got %s" %
            (where, ", ".join(_keys_of(desc)), _describe(data)), prefix))
        return
    for key, value in data.items():
        try:
            _fill_key(msg, desc, key, value, prefix, where, errors)
        except SpecError as e:
            errors.append(e)


def _fill_key(msg, desc, key, value, prefix, where, errors):
    if not isinstance(key, str):
        raise SpecError("%s: key %r is not a name; valid keys: %s" %
                        (where, key, ", ".join(_keys_of(desc))), prefix)
    path = prefix + "." + key if prefix else key
    field = desc.fields_by_name.get(key)
    if field is None:
        keys = _keys_of(desc)
        close = difflib.get_close_matches(key, keys, n=1)
        hint = " (did you mean '%s'?)" % close[0] if close else ""
        scope = "of %s" % prefix if prefix else "at the top level"
        raise SpecError("unknown key '%s'%s; valid keys %s: %s" %
                        (path, hint, scope, ", ".join(keys)), path)
    if value is None:  # `key:` with nothing after it: leave unset
        return
    if field.label == FD.LABEL_REPEATED:
        if not isinstance(value, list):
            raise SpecError("%s: expected a list, got %s" %
                            (path, _describe(value)), path)
        target = getattr(msg, key)
        for i, item in enumerate(value):
            ipath = "%s[%d]" % (path, i)
            if field.type == FD.TYPE_MESSAGE:
                _fill(target.add(), item, ipath, errors)
            elif item is None:
                errors.append(SpecError("%s: empty list item" % ipath, ipath))
            else:
                try:
                    target.append(_parse_scalar(field, item, ipath))
                except SpecError as e:
                    errors.append(e)
    elif field.type == FD.TYPE_MESSAGE:
        sub = getattr(msg, key)
        sub.SetInParent()
        _fill(sub, value, path, errors)
    else:
        setattr(msg, key, _parse_scalar(field, value, path))


def spec_from_dict(data, source=None):
    """Builds a ``JobSpec`` from nested dicts (the YAML document).

    Raises ``SpecError`` naming the key path for unknown keys and wrong types.
    """
    spec = job_pb2.JobSpec()
    errors = []
    _fill(spec, data, "", errors)
    if len(errors) == 1:
        e = errors[0]
        raise SpecError(e.message, e.path, source)
    if errors:
        # Every problem, one per line; `path` is the first's.
        raise SpecError(
            "%d problems:\n%s" % (len(errors), "\n".join(
                "  - " + e.message for e in errors)),
            errors[0].path, source)
    return spec


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hashable = key in seen
            except TypeError:
                hashable = False
            if hashable:
                raise yaml.constructor.ConstructorError(
                    None, None, "duplicate key %r (first on line %d)" %
                    (key, seen[key] + 1), key_node.start_mark)
            try:
                seen[key] = key_node.start_mark.line
            except TypeError:
                pass
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text, source=None):
    """Parses YAML text into a ``JobSpec``."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise SpecError("invalid YAML: %s" % str(e).replace("\n", " "),
                        source=source) from None
    except RecursionError:
        # PyYAML parses nesting recursively: a document nested hundreds of
        # levels deep exhausts the interpreter's stack.
        raise SpecError("invalid YAML: nested too deeply to read; a job spec "
                        "is sections of values (e.g. model: {layers: 4}), a "
                        "few levels deep", source=source) from None
    if data is None:
        raise SpecError("the job spec is empty", source=source)
    return spec_from_dict(data, source=source)


# Fields naming a file or directory: in a spec file, a relative value is
# relative to the file's own directory (the coordinator and the workers do
# not share the submitting shell's working directory).
_PATH_FIELDS = (("model", "path"), ("model", "init_from"), ("data", "path"),
                ("checkpoint", "dir"))


def load_spec_file(path):
    """Reads a YAML job spec file into a ``JobSpec``. Relative
    ``model.path``, ``model.init_from``, ``data.path`` and ``checkpoint.dir``
    are made absolute against the spec file's directory."""
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise SpecError("cannot read job spec %s: %s" %
                        (path, e.strerror or e)) from None
    spec = parse_yaml(text, source=path)
    base = os.path.dirname(os.path.abspath(path))
    for section, field in _PATH_FIELDS:
        msg = getattr(spec, section)
        value = getattr(msg, field)
        if value and not os.path.isabs(value):
            setattr(msg, field, os.path.normpath(os.path.join(base, value)))
    return spec


def to_job_spec(spec):
    """A ``JobSpec`` from a JobSpec, a dict, or the path of a YAML file."""
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    if isinstance(spec, dict):
        return spec_from_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        return load_spec_file(spec)
    raise TypeError("spec must be a tandem.v1.JobSpec, a dict or the path of "
                    "a YAML file, not %s" % type(spec).__name__)


def spec_to_dict(msg):
    """A ``JobSpec`` (or any message) as nested dicts, every field included,
    enums by their short names; the inverse of ``spec_from_dict``."""
    out = {}
    for field in msg.DESCRIPTOR.fields:
        value = getattr(msg, field.name)
        if field.label == FD.LABEL_REPEATED:
            if field.type == FD.TYPE_MESSAGE:
                out[field.name] = [spec_to_dict(v) for v in value]
            elif field.type == FD.TYPE_ENUM:
                out[field.name] = [enum_short_name(field.enum_type, v)
                                   for v in value]
            else:
                out[field.name] = list(value)
        elif field.type == FD.TYPE_MESSAGE:
            out[field.name] = spec_to_dict(value)
        elif field.type == FD.TYPE_ENUM:
            out[field.name] = enum_short_name(field.enum_type, value)
        else:
            out[field.name] = value
    return out


def spec_to_yaml(msg):
    """A ``JobSpec`` as YAML text, keys in .proto order."""
    return yaml.safe_dump(spec_to_dict(msg), sort_keys=False,
                          default_flow_style=False)


def items_per_step(spec, job=None):
    """("tokens" or "samples", how many one step trains on over all ranks):
    the coordinator's figure (job.throughput_unit, job.items_per_step: an
    exported model fed named inputs trains on samples) when the job has it,
    else tokens, global_tokens_per_step."""
    if job is not None and job.throughput_unit and job.items_per_step > 0:
        return job.throughput_unit, job.items_per_step
    return "tokens", global_tokens_per_step(spec)


def global_tokens_per_step(spec):
    """Tokens one optimizer step consumes over all ranks:
    world_size × micro_batch × seq_len × grad_accum."""
    return (max(spec.parallel.world_size, 1) * spec.batch.micro_batch *
            spec.batch.seq_len * max(spec.batch.grad_accum, 1))

"""The job spec documented in client/README.md is complete and valid."""

import re

import yaml
from google.protobuf.descriptor import FieldDescriptor as FD

from tandem.spec import parse_yaml
from tandem_harness import PY_ROOT
from tandem.v1 import job_pb2

README = PY_ROOT.parent / "README.md"


def readme_spec_text():
    text = README.read_text()
    m = re.search(r"tests/test_docs\.py -->\n```yaml\n(.*?)```", text, re.S)
    assert m, "the complete job spec block is missing from client/README.md"
    return m.group(1)


def missing_keys(desc, data, prefix=""):
    out = []
    for f in desc.fields:
        path = prefix + f.name
        if f.name not in data:
            out.append(path)
        elif f.type == FD.TYPE_MESSAGE and f.label != FD.LABEL_REPEATED:
            out += missing_keys(f.message_type, data[f.name] or {}, path + ".")
    return out


def test_readme_spec_shows_every_jobspec_key():
    data = yaml.safe_load(readme_spec_text())
    assert missing_keys(job_pb2.JobSpec.DESCRIPTOR, data) == []


def test_readme_spec_is_accepted_by_the_coordinator(client):
    spec = parse_yaml(readme_spec_text(), source="README")
    job = client.submit(spec)
    assert job.state == job_pb2.JOB_STATE_PENDING
    assert job.spec == spec  # complete: the coordinator had nothing to fill
    client.cancel(job.id)

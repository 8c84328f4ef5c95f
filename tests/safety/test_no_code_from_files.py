"""No file quantroll reads can run code: a planted pickle is refused unread, the state
format holds only tensors and JSON, and nothing in the code base unpickles or evaluates
data (a scan that fails on the patterns that would)."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import pytest
from safetensors import safe_open

from quantroll.cli import main
from tests.safety.helpers import train_args, write_model

REPO = Path(__file__).resolve().parents[2]


class _Payload:
    """Unpickling this creates the file named by ``marker``: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("m") / "model")


def test_a_planted_pickle_is_refused_without_running(model, tmp_path, capsys):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"step": 1, "model": _Payload(marker)})
    pickle.loads(payload)  # the payload works: unpickling it does create the file
    assert marker.exists()
    marker.unlink()
    pointer = json.dumps({"format": "quantroll-trainer-state", "state": "step-00000001-0123abcd", "step": 1})
    for name in ("trainer_state.pt", "state.safetensors", "state.json", "LATEST"):
        save = tmp_path / name.replace(".", "_")
        version = save / "step-00000001-0123abcd"
        if name != "trainer_state.pt":  # the layout of the current format, one file of it the pickle
            version.mkdir(parents=True)
            (save / "LATEST").write_text(pointer)
            for f in ("state.safetensors", "state.json"):
                (version / f).write_bytes(b"{}")
        else:
            save.mkdir()
        (save / name if name in ("trainer_state.pt", "LATEST") else version / name).write_bytes(payload)
        rc = main(train_args(model, "--load", str(save), "--num-rollout", "4"))
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert not marker.exists(), f"the pickle in {name} ran"


def test_a_save_holds_only_tensors_and_json(model, tmp_path):
    save = tmp_path / "s"
    assert main(train_args(model, "--save", str(save), "--save-interval", "1")) == 0
    entries = sorted(p.name for p in save.iterdir())
    assert entries[:2] == [".quantroll", "LATEST"] and len(entries) == 3, entries
    assert json.loads((save / ".quantroll").read_text())["files"] == ["LATEST"]  # the marker is JSON too
    version = save / json.loads((save / "LATEST").read_text())["state"]
    assert sorted(p.name for p in version.iterdir()) == ["state.json", "state.safetensors"]
    record = json.loads((version / "state.json").read_text())
    assert record["step"] == 1 and all(isinstance(x, int) for x in record["torch_rng"])
    with safe_open(str(version / "state.safetensors"), framework="pt") as f:
        names = list(f.keys())
    assert any(n.startswith("model.") for n in names) and any(n.startswith("master.") for n in names)
    assert any(n.startswith("adam.") for n in names)


# Code that would turn a file's bytes into running code. ``eval(`` / ``exec(`` as calls of
# the builtins (a method such as ``model.eval()`` is not one).
FORBIDDEN = {
    "weights_only=False": re.compile(r"weights_only\s*=\s*False"),
    "torch.load without weights_only=True": re.compile(r"torch\.load\((?![^)]*weights_only\s*=\s*True)"),
    "pickle.load": re.compile(r"\b(c?pickle|dill|cloudpickle|joblib)\.loads?\("),
    "pickle.Unpickler": re.compile(r"\bUnpickler\("),
    "marshal.load": re.compile(r"\bmarshal\.loads?\("),
    "shelve": re.compile(r"\bshelve\.open\("),
    "yaml.load": re.compile(r"\byaml\.(unsafe_)?load\((?![^)]*SafeLoader)"),
    "numpy allow_pickle": re.compile(r"allow_pickle\s*=\s*True"),
    "eval(": re.compile(r"(?<![\w.])eval\("),
    "exec(": re.compile(r"(?<![\w.])exec\("),
}
# (file, pattern) pairs that are not data: each with its reason.
ALLOWED: dict[tuple[str, str], str] = {}


def _code_lines(path: Path):
    for number, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0]
        if code.strip():
            yield number, code


def test_nothing_in_the_code_base_unpickles_or_evaluates_data():
    sources = sorted((REPO / "quantroll").rglob("*.py")) + sorted((REPO / "bench").rglob("*.py"))
    assert len(sources) > 50
    found = []
    for path in sources:
        rel = str(path.relative_to(REPO))
        for number, code in _code_lines(path):
            for name, pattern in FORBIDDEN.items():
                if pattern.search(code) and (rel, name) not in ALLOWED:
                    found.append(f"{rel}:{number}: {name}: {code.strip()}")
    assert not found, "\n".join(found)


def test_the_scan_catches_what_it_is_for(tmp_path):
    """The patterns match the calls they forbid, and leave the look-alikes alone."""
    bad = ["state = torch.load(path, map_location='cpu', weights_only=False)", "x = torch.load(f)",
           "obj = pickle.load(f)", "obj = pickle.loads(raw)", "value = eval(text)", "exec(code)",
           "cfg = yaml.load(f)", "np.load(p, allow_pickle=True)"]
    fine = ["model.eval()", "policy.eval().requires_grad_(False)", "torch.load(f, weights_only=True)",
            "pickle.dumps(obj)", "ast.literal_eval(text)", "yaml.load(f, Loader=yaml.SafeLoader)", "evaluate(x)"]
    for line in bad:
        assert any(p.search(line) for p in FORBIDDEN.values()), line
    for line in fine:
        assert not any(p.search(line) for p in FORBIDDEN.values()), line

"""docs/recipes.md, for real: Hugging Face's ``Trainer`` (examples/hf_trainer.py), Ray Data
preprocessing into a dataset the loader reads (examples/ray_data_preprocess.py), and a Jupyter
notebook run by a real kernel; and the loader's refusal of a batching ``DataLoader``.

transformers, ray, nbclient, nbformat and ipykernel are installed by ``make test``: a missing one
fails here at import, never skips.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import lance
import pytest
import transformers  # noqa: F401  (installed: a missing framework fails the module)
from test_frameworks import run
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader

ROOT = Path(__file__).parents[1]
EXAMPLES = ROOT / "examples"
SUPPORT = Path(__file__).parent / "support"
PAGE = ROOT / "docs" / "recipes.md"
EXCERPT = re.compile(r"<!-- excerpt: (\S+) -->\n```python\n(.*?)```", re.S)
REBATCHING = "a DataLoader with a batch_size (not None) iterates this PrefetchLoader"


def test_the_pages_excerpts_are_lines_of_their_examples():
    """Every line of docs/recipes.md's ``<!-- excerpt: path -->`` snippets is a line of that
    example (which the tests below run), and the error it quotes is the loader's."""
    found = EXCERPT.findall(PAGE.read_text())
    assert sorted(path for path, _ in found) == [
        "examples/hf_trainer.py",
        "examples/ray_data_preprocess.py",
    ]
    for path, code in found:
        source = {line.strip() for line in (ROOT / path).read_text().splitlines()}
        missing = [line for line in code.splitlines() if line.strip() not in source]
        assert missing == [], f"lines of docs/recipes.md not in {path}"
    quoted = " ".join(PAGE.read_text().split("```text\nValueError: ")[1].split("```")[0].split())
    assert quoted.startswith(REBATCHING + ", which yields whole batches of 8 rows")


def test_a_batching_dataloader_is_refused(ids_25):
    """``DataLoader(loader)`` (``batch_size=1``) and ``DataLoader(loader, batch_size=4)`` would
    stack the loader's batches into batches of batches: refused at ``iter()``, naming the fix;
    ``batch_size=None`` hands the loader's batches out as they are."""
    loader = PrefetchLoader(ids_25, 5, seed=0)
    for data in (DataLoader(loader), DataLoader(loader, batch_size=4)):
        with pytest.raises(ValueError) as error:
            iter(data)
        assert str(error.value).startswith(REBATCHING + ", which yields whole batches of 5 rows")
        assert "Use DataLoader(loader, batch_size=None)" in str(error.value)
        quoted = " ".join(
            PAGE.read_text().split("```text\nValueError: ")[1].split("```")[0].split()
        )
        assert quoted == str(error.value).replace("5 rows", "8 rows")
    batches = [batch["id"].tolist() for batch in DataLoader(loader, batch_size=None)]
    assert batches == [b.indices.tolist() for b in loader.epoch_plan(0).rank_batches(0)]


@pytest.mark.slow
def test_a_batching_dataloader_is_refused_in_its_workers(ids_25):
    """With a spawn DataLoader worker the worker refuses as it starts; torch re-raises it."""
    loader = PrefetchLoader(ids_25, 5, seed=0)
    data = DataLoader(loader, batch_size=2, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(ValueError) as error:
        next(iter(data))
    assert str(error.value).startswith("Caught ValueError in DataLoader worker process 0")
    assert f"ValueError: {REBATCHING}, which yields whole batches of 5 rows" in str(error.value)


def epoch_batches(uri: str, epoch: int, batch_size: int) -> list[list[int]]:
    """The ``id``s of each batch of ``epoch`` (seed 0, one rank), from the loader's plan: the
    plan's row positions mapped to the dataset's ``id`` column."""
    loader = PrefetchLoader(uri, batch_size, columns=["id"], seed=0)
    ids = lance.dataset(uri).to_table(columns=["id"])["id"].to_pylist()
    return [[ids[i] for i in b.indices.tolist()] for b in loader.epoch_plan(epoch).rank_batches(0)]


@pytest.mark.slow
def test_hf_trainer_trains_on_the_loaders_batches_and_resumes_exactly(tmp_path):
    """examples/hf_trainer.py, 1 CPU process, 64 rows, batches of 8, 2 epochs: the model's
    forward saw, step for step, the loader's plan of epoch 0 then epoch 1 (8 ids a batch, each id
    once an epoch: no batches of batches, ``set_epoch`` reached the loader); a run resumed from
    ``checkpoint-11`` (epoch 1, after its batch 2) trained on the full run's last 5 batches; with
    2 batches an optimizer step the same batches, and resumed from ``checkpoint-5`` the last 6. A
    stock ``Trainer`` given the loader meets the loader's refusal."""
    out = run([sys.executable, str(SUPPORT / "hf_trainer_runs.py"), str(tmp_path)])
    uri = str(tmp_path / "data.lance")
    full = [
        json.loads(line)["ids"] for line in (tmp_path / "full-0.jsonl").read_text().splitlines()
    ]
    plans = [epoch_batches(uri, epoch, 8) for epoch in range(2)]
    assert full == plans[0] + plans[1]
    for plan in plans:
        assert sorted(i for batch in plan for i in batch) == list(range(64))
    resumed = (tmp_path / "resumed-0.jsonl").read_text().splitlines()
    assert [json.loads(line)["ids"] for line in resumed] == full[11:]
    assert "trained 16 steps, 16 batches in this run" in out
    assert "trained 16 steps, 5 batches in this run" in out
    # 2 batches an optimizer step: the same batches; resumed after step 5 (epoch 1, its first
    # step done), the last 6 batches
    accumulated = (tmp_path / "accumulated-0.jsonl").read_text().splitlines()
    assert [json.loads(line)["ids"] for line in accumulated] == full
    resumed = (tmp_path / "accumulated-resumed-0.jsonl").read_text().splitlines()
    assert [json.loads(line)["ids"] for line in resumed] == full[10:]
    assert "trained 8 steps, 16 batches in this run" in out
    assert "trained 8 steps, 6 batches in this run" in out
    assert f"stock Trainer: {REBATCHING}, which yields whole batches of 8 rows" in out


@pytest.mark.slow
def test_hf_trainer_on_two_processes_gives_each_rank_its_batches_and_resumes_exactly(tmp_path):
    """examples/hf_trainer.py under ``torchrun`` (2 CPU processes, gloo; Accelerate's default
    dispatcher), 64 rows, batches of 4, 2 epochs: each rank's model saw its rank's plan of epoch 0
    then epoch 1 (every row once an epoch over the ranks); a run resumed from ``checkpoint-5``
    trained on each rank's batches from its 6th on."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    script = str(SUPPORT / "hf_trainer_runs.py")
    out = run([*torchrun, "--nproc_per_node", "2", script, str(tmp_path), "ddp"], timeout=200)
    assert out.count("trained 16 steps, 16 batches in this run") == 2
    assert out.count("trained 16 steps, 11 batches in this run") == 2
    uri = str(tmp_path / "data.lance")
    for epoch in range(2):
        ids = [i for rank in range(2) for b in rank_plan(uri, epoch, rank) for i in b]
        assert sorted(ids) == list(range(64))
    for rank in range(2):
        lines = (tmp_path / f"full-{rank}.jsonl").read_text().splitlines()
        full = [json.loads(line)["ids"] for line in lines]
        assert full == rank_plan(uri, 0, rank) + rank_plan(uri, 1, rank), rank
        lines = (tmp_path / f"resumed-{rank}.jsonl").read_text().splitlines()
        assert [json.loads(line)["ids"] for line in lines] == full[5:], rank


def rank_plan(uri: str, epoch: int, rank: int) -> list[list[int]]:
    """Rank ``rank`` of 2's batches (of 4) in ``epoch`` (seed 0); ids are positions here."""
    loader = PrefetchLoader(uri, 4, rank=rank, world_size=2, seed=0)
    return [batch.indices.tolist() for batch in loader.epoch_plan(epoch).rank_batches(rank)]


@pytest.mark.system
@pytest.mark.slow
def test_ray_data_preprocessed_dataset_reads_uniform_batches(tmp_path):
    """examples/ray_data_preprocess.py (a local Ray cluster of 1 CPU, 100 raw rows): Ray Data's
    tasks wrote 5 fragments, committed as version 1; the loader's epochs 0 and 1 are its plan,
    batch for batch (10 ids each, every id once an epoch), and every row holds what
    ``preprocess`` computes from its raw row."""
    raw, ready = str(tmp_path / "raw.lance"), str(tmp_path / "ready.lance")
    command = [sys.executable, str(SUPPORT / "ray_data_runs.py"), raw, ready]
    out = run(command, timeout=200)
    assert "epoch 1: 10 batches from version 1" in out
    recorded = json.loads(out.splitlines()[-1])
    dataset = lance.dataset(ready)
    assert dataset.version == 1 and len(dataset.get_fragments()) == 5
    for epoch in range(2):
        assert recorded[epoch] == epoch_batches(ready, epoch, 10)
        assert sorted(i for batch in recorded[epoch] for i in batch) == list(range(100))
    rows = {row["id"]: row for row in dataset.to_table().to_pylist()}
    for i in range(100):
        text = f"row {i}: " + "ab" * (i % 7)
        expected = [text.count("a"), text.count("b"), text.count("r"), text.count(" ")]
        assert rows[i] == {"id": i, "length": len(text), "counts": expected}, i
    assert rows[6] == {"id": 6, "length": 19, "counts": [6, 6, 1, 2]}  # "row 6: abababababab"


#: The notebook of test_notebook_recipes, a cell a string.
NOTEBOOK = [
    """\
import json
import re

import lance
import numpy as np
import pyarrow as pa
from torch.utils.data import DataLoader

from lance_prefetch import PrefetchLoader

lance.write_dataset(pa.table({"id": np.arange(20)}), "ids.lance")""",
    # the pitfall: a function defined in the notebook, in a spawn DataLoader worker
    """\
def double(batch):
    return {"id": batch["id"], "twice": 2 * batch["id"]}

loader = PrefetchLoader("ids.lance", 5, seed=0, transform=double)
data = DataLoader(loader, batch_size=None, num_workers=1, multiprocessing_context="spawn")
try:
    next(iter(data))
except RuntimeError as error:
    print("RuntimeError:", error)""",
    # recipe 1: no DataLoader workers; the loader's read threads run the transform
    """\
loader = PrefetchLoader("ids.lance", 5, seed=0, transform=double)
print(json.dumps([batch["twice"].tolist() for batch in loader]))""",
    # recipe 2: the transform in a module next to the notebook, importable by the workers
    """\
%%writefile transforms.py
def double(batch):
    return {"id": batch["id"], "twice": 2 * batch["id"]}""",
    """\
import transforms

loader = PrefetchLoader("ids.lance", 5, seed=0, transform=transforms.double)
data = DataLoader(loader, batch_size=None, num_workers=1, multiprocessing_context="spawn")
print(json.dumps([batch["twice"].tolist() for batch in data]))""",
]


@pytest.mark.slow
def test_notebook_recipes(tmp_path, monkeypatch, capfd):
    """The cells of ``NOTEBOOK`` run by a real IPython kernel (this interpreter's, from a
    kernelspec written for it): a transform defined in the notebook kills a spawn DataLoader
    worker (it cannot unpickle ``__main__.double``: the worker's error and the DataLoader's are
    the ones docs/recipes.md quotes); iterated without workers, the loader runs it in its read threads;
    imported from a module, it runs in a spawn worker. Both read epoch 0's plan, doubled."""
    import ipykernel.kernelspec
    import nbformat
    from nbclient import NotebookClient

    ipykernel.kernelspec.install(kernel_name="lance-prefetch-test", prefix=str(tmp_path / "k"))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "k" / "share" / "jupyter"))
    cells = [nbformat.v4.new_code_cell(source) for source in NOTEBOOK]
    notebook = nbformat.v4.new_notebook(cells=cells)
    client = NotebookClient(
        notebook,
        kernel_name="lance-prefetch-test",
        timeout=90,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working folder
    )
    client.execute()
    streams = [
        [(out["name"], out["text"]) for out in cell.outputs if out["output_type"] == "stream"]
        for cell in notebook.cells
    ]
    stdout = ["".join(text for name, text in cell if name == "stdout") for cell in streams]
    stderr = "".join(text for cell in streams for name, text in cell if name == "stderr")
    assert re.fullmatch(
        r"RuntimeError: DataLoader worker \(pid\(s\) \d+\) exited unexpectedly\n", stdout[1]
    )
    # the worker's traceback: in the cell's output, or (ipykernel may not capture a child's
    # output in time) on the kernel's own stderr, which is this process's
    worker_error = "AttributeError: Can't get attribute 'double' on <module '__main__' (built-in)>"
    assert worker_error in stderr + capfd.readouterr().err
    uri = str(tmp_path / "ids.lance")
    plan = [[2 * i for i in batch] for batch in epoch_batches(uri, 0, 5)]
    assert json.loads(stdout[2]) == plan
    assert (tmp_path / "transforms.py").exists()
    assert json.loads(stdout[4]) == plan

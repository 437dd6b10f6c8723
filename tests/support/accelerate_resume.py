"""Accelerate checkpoints resumed for real, for tests/test_frameworks.py: in one ``torchrun`` launch
of 2 CPU processes (gloo), each case trains 2 epochs of 20 steps per process (403 rows, batches
of 10, seed 0), stops after 7 steps of epoch 0 or 1 and saves its own way; then a new Accelerator,
loader and DataLoader in the same launch load what was saved and finish the 2 epochs.

Ways (the first word of a case's name):

- ``stateful``: ``use_stateful_dataloader=True``, ``accelerator.save_state(folder)`` and
  ``accelerator.load_state(folder)``;
- ``own``: the main process's ``loader.state_dict()``, loaded into every process's new loader;
- ``after``: ``loader.state_after(steps)`` (the loop's own count), likewise;
- ``skip``: nothing saved: ``accelerator.skip_first_batches(data, steps)`` for the rest of the
  stopped epoch, ``set_epoch`` on it.

Each process writes ``<folder>/<case>-<stop epoch>-<rank>.jsonl``: a line ``{"part", "epoch",
"ids"}`` per step (``"part"``: ``"stop"`` before the stop, ``"resume"`` after), or
``{"refused": message}`` when training, saving or resuming raised (on any process: all skip
the rest).

    torchrun --nproc_per_node 2 accelerate_resume.py <folder> [case ...]
"""

from __future__ import annotations

import gc
import hashlib
import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

from classification_data import write_dataset  # noqa: E402

from lance_prefetch import PrefetchLoader  # noqa: E402

ROWS, BATCH, EPOCHS, STOP = 403, 10, 2, 7

#: case: (way, dispatch_batches, DataLoader workers)
CASES = {
    "stateful-dispatch": ("stateful", None, 0),
    "stateful-shard": ("stateful", False, 0),
    "stateful-dispatch-workers": ("stateful", None, 2),
    "stateful-shard-workers": ("stateful", False, 2),
    "own-dispatch": ("own", None, 0),
    "own-shard": ("own", False, 0),
    "after-dispatch": ("after", None, 0),
    "skip-dispatch": ("skip", None, 0),
    "skip-shard": ("skip", False, 0),
}
#: A case named ``<case>@<step>`` stops after ``step`` steps instead (20: an epoch's last).


def build(uri: str, way: str, dispatch: bool | None, workers: int):
    """A new Accelerator (the process group stays), loader and prepared DataLoader."""
    config = DataLoaderConfiguration(
        dispatch_batches=dispatch, use_stateful_dataloader=way == "stateful"
    )
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    loader = PrefetchLoader(uri, BATCH, columns=["id"], seed=0)
    data = DataLoader(
        loader,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
        persistent_workers=workers > 0,
    )
    return accelerator, loader, accelerator.prepare(data)


def agree(error: BaseException | None) -> str | None:
    """The first process's refusal, if any process refused (all processes call this)."""
    errors: list[str | None] = [None] * dist.get_world_size()
    message = None if error is None else f"{type(error).__name__}: {error}"
    dist.all_gather_object(errors, message)
    return next((e for e in errors if e is not None), None)


def written(data) -> str:
    """The SHA-256 of what ``accelerator.save_state`` writes to ``dl_state_dict.bin`` for the
    prepared DataLoader ``data`` in this process, now."""
    buffer = io.BytesIO()
    torch.save(data.state_dict(), buffer)
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def save(way: str, accelerator: Accelerator, loader: PrefetchLoader, data, saved: Path, stop: int):
    """Save the checkpoint ``way`` says at step ``stop`` (``data``: the prepared DataLoader); the
    error if it was refused. With ``stateful``, also ``<saved>/written-<rank>``: :func:`written`."""
    try:
        if way == "stateful":
            accelerator.save_state(str(saved))
            with open(saved / f"written-{accelerator.process_index}", "w") as out:
                out.write(written(data))
        elif way in ("own", "after") and accelerator.is_main_process:
            state = loader.state_dict() if way == "own" else loader.state_after(stop)
            saved.write_text(json.dumps(state))
    except Exception as error:  # a refusal: recorded, and every process skips the resume
        return error
    return None


def run_case(folder: Path, case: str, stop_epoch: int) -> None:
    name, _, step = case.partition("@")
    way, dispatch, workers = CASES[name]
    stop = int(step) if step else STOP
    uri = str(folder / "data.lance")
    rank = dist.get_rank()
    saved = folder / f"{case}-{stop_epoch}-saved"
    out = open(folder / f"{case}-{stop_epoch}-{rank}.jsonl", "w")

    def record(part: str, epoch: int, batch) -> None:
        out.write(json.dumps({"part": part, "epoch": epoch, "ids": batch["id"].tolist()}) + "\n")

    accelerator = loader = data = None
    error = None
    try:
        accelerator, loader, data = build(uri, way, dispatch, workers)
        for epoch in range(stop_epoch + 1):
            data.set_epoch(epoch)
            for step, batch in enumerate(data, 1):
                record("stop", epoch, batch)
                if (epoch, step) == (stop_epoch, stop):  # save within the step, as a loop does
                    error = save(way, accelerator, loader, data, saved, stop)
                    break
    except Exception as e:  # refused before the save (every process raises at once)
        error = e
    if loader is not None:
        loader.close()
    del accelerator, loader, data
    gc.collect()
    refused = agree(error)
    if refused is None:
        accelerator, loader, data = build(uri, way, dispatch, workers)
        try:
            if way == "stateful":
                accelerator.load_state(str(saved))
            elif way in ("own", "after"):
                loader.load_state_dict(json.loads(saved.read_text()))
            for epoch in range(stop_epoch, EPOCHS):
                skipping = way == "skip" and epoch == stop_epoch
                active = accelerator.skip_first_batches(data, stop) if skipping else data
                active.set_epoch(epoch)
                for batch in active:
                    record("resume", epoch, batch)
        except Exception as e:
            error = e
        loader.close()
        del accelerator, loader, data
        gc.collect()
        refused = agree(error)
    if refused is not None:
        out.write(json.dumps({"refused": refused}) + "\n")
    out.close()


def main() -> None:
    folder = Path(sys.argv[1])
    cases = sys.argv[2:] or list(CASES)
    accelerator = Accelerator(cpu=True)
    if accelerator.is_main_process and not (folder / "data.lance").exists():
        write_dataset(str(folder / "data.lance"), ROWS)
    accelerator.wait_for_everyone()
    for case in cases:
        for stop_epoch in (0, 1):
            run_case(folder, case, stop_epoch)
            if accelerator.is_main_process:
                print(f"{case} stopped in epoch {stop_epoch}: done", flush=True)  # noqa: T201


if __name__ == "__main__":
    main()

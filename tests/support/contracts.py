"""Contracts every way of reading must keep, as reusable checks (like torchdata's
``run_test_save_load_state``)."""

from __future__ import annotations

import itertools
import json

from support.helpers import batch_ids


def check_resume(make, *, midpoint: int, epoch: int = 0) -> None:
    """The resume contract of a loader built by ``make()``: stopped after ``midpoint`` batches of
    ``epoch``, its ``state_dict()`` (through JSON) loaded into a new loader delivers exactly the
    rest of that epoch, and the iteration after that reads the next epoch whole: batch for batch
    the uninterrupted run. Stopped after (or past) the epoch's last batch, the state is of a
    finished epoch: the new loader's next iteration reads the next epoch."""
    reference = make()
    reference.set_epoch(epoch)
    whole = batch_ids(reference)
    following = batch_ids(reference)  # no set_epoch: the next epoch

    loader = make()
    loader.set_epoch(epoch)
    iterator = iter(loader)
    head = batch_ids(itertools.islice(iterator, midpoint))
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert state["epoch"] == epoch

    resumed = make()
    resumed.load_state_dict(state)
    rest = batch_ids(resumed)
    if len(head) < len(whole):
        assert head + rest == whole, (midpoint, len(head), len(rest), len(whole))
        assert batch_ids(resumed) == following
    else:  # stopped after the epoch's last batch: nothing is left of it, the next epoch follows
        assert head == whole and rest == following

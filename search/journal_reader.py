"""Optuna's journal read as JSON lines, without importing Optuna: for the read-only
commands (``status``), which must stay fast, and which read a study a search may be
writing. The study is the journal's only one, so a trial's id is its number.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Optuna's journal operations, by op code (optuna.storages.journal's JournalOperation)
CREATE_TRIAL, SET_TRIAL_STATE_VALUES, SET_TRIAL_INTERMEDIATE_VALUE, SET_TRIAL_USER_ATTR = 4, 6, 7, 8
# Optuna's TrialState values, as its journal records them
TRIAL_STATES = {0: "RUNNING", 1: "COMPLETE", 2: "PRUNED", 3: "FAIL", 4: "WAITING"}
WAITING = 4  # queued (enqueue_trial), not handed out yet


def journal_records(journal: Path, op_codes: tuple[int, ...]) -> Iterator[dict[str, Any]]:
    """The journal's records of these operations, in order. Other lines are not parsed
    (most are values and attributes), and a line cut short by a kill is skipped."""
    if not journal.is_file():
        return
    wanted = re.compile(r'"op_code":\s*(?:%s)\s*[,}]' % "|".join(map(str, op_codes)))
    with journal.open(encoding="utf-8") as lines:
        for line in lines:
            if not wanted.search(line):
                continue
            try:
                yield json.loads(line)
            except ValueError:
                continue


def trial_states(journal: Path) -> list[int]:
    """Each trial's state, by ``TrialState``'s value (``WAITING``: queued)."""
    states: list[int] = []
    for record in journal_records(journal, (CREATE_TRIAL, SET_TRIAL_STATE_VALUES)):
        if record.get("op_code") == CREATE_TRIAL:
            states.append(int(record.get("state", 0)))
        elif 0 <= int(record.get("trial_id", -1)) < len(states):
            states[int(record["trial_id"])] = int(record.get("state", 0))
    return states


def one_trial(journal: Path, number: int, user_attr: str) -> dict[str, Any]:
    """What the journal holds of one trial beyond trials.csv: its metric's value at each
    epoch it reported (``values``, by epoch; a resumed trial's later report of an epoch
    replaces the earlier), its ``state`` (``TRIAL_STATES``' name), and its ``user_attr``
    (None when unset). Only ``values`` for a trial the journal lacks."""
    found: dict[str, Any] = {"values": {}}
    created = -1
    for record in journal_records(journal, (CREATE_TRIAL, SET_TRIAL_STATE_VALUES, SET_TRIAL_INTERMEDIATE_VALUE,
                                            SET_TRIAL_USER_ATTR)):
        op = record.get("op_code")
        if op == CREATE_TRIAL:
            created += 1
            if created == number:
                found["state"] = TRIAL_STATES.get(record.get("state", 0))
                found[user_attr] = (record.get("user_attrs") or {}).get(user_attr)
        elif record.get("trial_id") != number:
            continue
        elif op == SET_TRIAL_STATE_VALUES:
            found["state"] = TRIAL_STATES.get(record.get("state", 0))
        elif op == SET_TRIAL_INTERMEDIATE_VALUE:
            found["values"][int(record["step"])] = record.get("intermediate_value")
        elif user_attr in (record.get("user_attr") or {}):
            found[user_attr] = record["user_attr"][user_attr]
    return found

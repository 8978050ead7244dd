#!/usr/bin/env python3
"""Reads TensorBoard event files with TensorBoard's own reader (its EventAccumulator, which checks
each record's CRC-32C) and prints every scalar as JSON: {"tag": [[step, value], ...], ...}, for
tests/train/tensorboard_test.cc's fixture (reference/fixtures/tensorboard) and for checking a
run's --tensorboard directory against its --metrics file.

usage: python3 reference/read_tensorboard.py DIR [METRICS.jsonl]
       (needs `pip install tensorboard`; the tests do not)
With METRICS.jsonl: checks that every number of every line is the scalar of its step (as float32)
and that there are no other scalars, and prints a one-line summary instead.
"""
import json
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read(directory):
    acc = EventAccumulator(directory, size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def flatten(j, prefix, out):
    for k, v in j.items():
        tag = f"{prefix}/{k}" if prefix else k
        if not prefix and k == "step":
            continue
        if isinstance(v, dict):
            flatten(v, tag, out)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[tag] = v


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    scalars = read(sys.argv[1])
    if len(sys.argv) < 3:
        print(json.dumps(scalars, indent=1, sort_keys=True))
        return
    want = {}
    for line in open(sys.argv[2]):
        j = json.loads(line)
        flat = {}
        flatten(j, "", flat)
        for tag, v in flat.items():
            want.setdefault(tag, []).append([j["step"], f32(float(v))])
    assert set(want) == set(scalars), (sorted(set(want) ^ set(scalars)))
    for tag in want:
        assert want[tag] == scalars[tag], (tag, want[tag][:3], scalars[tag][:3])
    n = sum(len(v) for v in want.values())
    print(f"TensorBoard's reader: {len(want)} tags, {n} scalars, every one equal to the metrics line's")


if __name__ == "__main__":
    main()

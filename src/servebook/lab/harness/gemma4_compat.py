"""What a Gemma 4 text config needs before vLLM 0.26.0 starts it under transformers 5.17.

Only for the lent H200 image (vLLM 0.26.0 with transformers 5.17, 2026-12-02 to 12-04); another
vLLM or transformers may need neither change, or may read the flag or the overrides differently.
The recorders that have started Gemma 4 engines go through here (``labs/tools/gpu_record.py``,
``labs/tools/kv_groups_probe.py`` through it, and the end-to-end child
:mod:`servebook.lab.e2e.child`), so neither a plan nor a config file needs a hand edit:

* :func:`engine_config`: transformers 5.17 marks ``head_dim`` a per-layer attribute of a
  ``gemma4_text`` config and refuses a global read of it unless
  ``allow_global_per_layer_attribute_access`` is set; vLLM 0.26.0 reads the global value while
  building its model config, so without the flag the engine does not start (2026-12-02).
* :func:`hf_overrides`: forcing that global access lets the engine start but is not enough.
  transformers 5.17 moves ``num_global_key_value_heads`` and ``global_head_dim`` out of the text
  config's global attributes; vLLM 0.26.0 then reads neither and builds the full-attention
  (global) layers with the sliding layers' heads: 8 x 256 instead of 2 x 512 for Gemma-4-26B-A4B,
  twice the KV bytes per token (labs/results/raw/kv-groups-gemma4-2026-12-04.json shows the
  groups). Passing the two
  attributes back as vLLM's ``hf_overrides`` restores the real shape
  (labs/results/raw/kv-groups-gemma4-overrides-2026-12-04.json).
* :func:`engine_args_with_overrides`: the engine flags with those overrides merged in. A value the
  caller already gives for an override key wins (a plan may set the wrong shape on purpose to
  reproduce it); a given value equal to the computed one changes nothing.

Nothing here imports vLLM or transformers.
"""
from __future__ import annotations

#: The config attribute transformers 5.17 wants before it allows a global read of a per-layer one.
FLAG = "allow_global_per_layer_attribute_access"
#: The model type whose config carries per-layer attributes (the text tower of a Gemma 4 checkpoint).
MODEL_TYPE = "gemma4_text"
#: The global-attention attributes transformers 5.17 takes out of the config's global ones.
GLOBAL_ATTENTION_KEYS = ("num_global_key_value_heads", "global_head_dim")
#: The note :func:`engine_config` gives when it adds the flag (the words recorded in start-up cases).
FLAG_NOTE = (f"added {FLAG}=true (transformers 5.17's per-layer config refuses vLLM 0.26.0's global "
             "head_dim read)")


def engine_config(cfg: dict) -> tuple[dict, list[str]]:
    """``(config for the engine, notes)``: ``cfg`` with ``allow_global_per_layer_attribute_access=true``
    added when it is a ``gemma4_text`` config that lacks the key, and one note saying so.

    Any other config, or a Gemma 4 config that already has the key (whatever its value), comes back
    unchanged (the same object) with no notes. ``cfg`` itself is never modified. Why the flag is
    needed: the module docstring (transformers 5.17 and vLLM 0.26.0 only).
    """
    if cfg.get("model_type") == MODEL_TYPE and FLAG not in cfg:
        return dict(cfg, **{FLAG: True}), [FLAG_NOTE]
    return cfg, []


def hf_overrides(cfg: dict) -> dict:
    """The ``hf_overrides`` vLLM 0.26.0 needs for ``cfg`` under transformers 5.17; ``{}`` when none.

    For a ``gemma4_text`` config: its ``num_global_key_value_heads`` and ``global_head_dim`` (those it
    has), passed again so that vLLM builds the global layers with their own heads (2 x 512 for
    Gemma-4-26B-A4B) instead of the sliding layers' (8 x 256). Any other config needs none.
    """
    if cfg.get("model_type") != MODEL_TYPE:
        return {}
    return {k: cfg[k] for k in GLOBAL_ATTENTION_KEYS if k in cfg}


def overrides_note(overrides: dict) -> str:
    """The note recorded when ``overrides`` are added to an engine's flags."""
    return (f"hf_overrides {overrides} (transformers 5.17 drops them from the text config; without them "
            "vLLM builds the global layers with the sliding layers' heads)")


def engine_args_with_overrides(engine_args: dict, cfg: dict) -> tuple[dict, list[str]]:
    """``(engine flags, notes)``: ``engine_args`` with :func:`hf_overrides` of ``cfg`` merged into its
    ``hf_overrides``.

    Policy: a key the caller's ``hf_overrides`` already holds keeps the caller's value (an explicit
    plan value wins; a note records a value that differs from the computed one); computed keys it
    lacks are added after its own (a note names them). When nothing is added, the flags come back
    unchanged (the same object): a plan that wrote the computed overrides by hand runs and records
    exactly as before. A non-dict ``hf_overrides`` (vLLM also takes a callable) is left alone, noted.
    ``engine_args`` itself is never modified.
    """
    computed = hf_overrides(cfg)
    if not computed:
        return engine_args, []
    given = engine_args.get("hf_overrides")
    if given is None:
        given = {}
    if not isinstance(given, dict):
        return engine_args, [f"hf_overrides given as {type(given).__name__}; {computed} not merged"]
    notes = [f"hf_overrides {k}={given[k]!r} kept from the engine flags (the config says {v!r})"
             for k, v in computed.items() if k in given and given[k] != v]
    added = {k: v for k, v in computed.items() if k not in given}
    if not added:
        return engine_args, notes
    return dict(engine_args, hf_overrides={**given, **added}), [overrides_note(added)] + notes

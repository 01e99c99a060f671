"""Ahead-of-time planning: what a train or embed step needs on a TPU pod or GPU cluster, compiled without one.

    elmo-jax plan --config=configs/lm1b.py --target=v5e:8x8 --per_device_batch=256

`plan/train.py` (`plan`: the train step's report), `plan/embed.py` (`plan_embed`: the embed step's), `plan/targets.py`
(a target's abstract devices). What they measure with is the room below: `elmo_jax/measure` (the FLOP count, the
HLO reading, the chips' peaks), which a run's throughput fields use too.
"""

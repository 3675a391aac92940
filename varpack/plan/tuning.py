"""Every tuned constant of the balance planner, in one record, each with its reason.

The planner's rules (docs/planning.md) are exact where they can be; where a rule trades one
figure for another, or bounds work, its constant lives here with the measurement that chose it,
and :data:`TESTS` names a test that fails without it; :data:`UNTESTED` lists those that have
none yet (``tests/plan/test_tuning.py`` checks that every constant is in one of the two). :data:`TUNING` holds their values by name. The kernels read
them as compile-time constants: a change here compiles the planner's kernels again
(:mod:`varpack.plan.numba_cache` keys them to every source of ``varpack/plan/``).
"""

from __future__ import annotations

# Steps composed by cost (:mod:`varpack.plan.stages.batching.costed`)

#: With ``--pp`` a step is composed from this share of its budget: a rank's micro-batches are all
#: padded to its fullest, so partly filled ones would cost their padding (measured 0.90: 14 %
#: padding on heavy-bodied lengths at grad-accum 16; 0.96: under 5 %).
PP_FILL = 0.96

#: At grad-accum 1 the slot cut takes the micro-batches of a window dealt window-wide within
#: this share of their block's mean cost as alike, in a seeded order
#: (:func:`~varpack.plan.kernels.slots.slot_order`; RL rollouts, dp 16: 0.02 1.017 / 0.198,
#: 0.04 1.019 / 0.193, 0.06 1.026 / 0.185 time vs ideal / mixing)
MIX_SHARE = 0.04


# Windows (:mod:`varpack.plan.kernels.compose`)

#: A window's steps (slots, where they are composed one by one: grad-accum 1, ``--sync micro``)
#: are as many as the window's cost fills at the light density when that is below this share
#: of the sorted packing's count: there heavy samples pack alone in sorted order (responses cut
#: at a generation cap), so sorted packing's count leaves the cost composer too few light
#: samples to level the slots beside them (RL rollouts, dp 16, grad-accum 1: 1.051x -> 1.023x)
#: and steps of fewer tokens than their micro-batches hold (grad-accum 4 under ``--sync step``:
#: 443 steps of 3.00 budgets a rank in 4 micro-batches -> 305-332 steps of 4.00); other sets
#: are within 0.9 and keep it
SLOTS_BY_COST = 0.9


# Heavy samples (:mod:`varpack.plan.kernels.heavy`)

#: A sample is heavy when its cost exceeds its tokens at the light density by more than this
#: share of a full micro-batch (measured on long-tail, heavy-bodied and bimodal lengths: 0.1
#: groups too many samples at grad-accum 1, 0.3 leaves some long samples ungrouped).
HEAVY_EXCESS = 0.2

#: A heavy sample costing less than this share of its group's first starts a new group
GROUP_RATIO = 0.5


# The deal (:mod:`varpack.plan.kernels.window`)

#: The share of a window's light samples, costliest first, that hungry steps take before the deal,
#: at grad-accum 1 and from 2 up (measured: 0.02 lifts mixing over 0.15 on heavy-bodied lengths at
#: grad-accum 1, 0 costs 0.01 to 0.02 of time vs ideal there; heavy tail, dp 32, grad-accum 2,
#: 5 seeds: 0.01 mixes 0.13-0.16 at 1.011-1.014x, 0.005 0.11-0.14 at 1.013-1.016x)
HUNGRY_SHARE = (0.01, 0.005)


# Step levelling (:mod:`varpack.plan.kernels.steplevel`)

#: Moves per step at most: each lowers the step's costliest rank, and a step of ``dp`` ranks
#: needs about ``dp`` of them to level every rank once (RL rollouts, dp 16, grad-accum 4: all
#: moves made within 32; 64 leaves room for dp 32). Bounds the work on steps of many samples.
STEP_MOVES = 64

#: A step whose costliest rank is within this share of its ranks' mean is level: what is left
#: to gain is below any figure's precision, and on steps of hundreds of short samples (the
#: long-SFT tail) the moves would otherwise go on shaving it (4 M samples, grad-accum 4:
#: 1.7 s -> 15 s a plan without it, the same 1.000x)
LEVEL = 1e-4


# Slot levelling at grad-accum 1 (:mod:`varpack.plan.kernels.level`)

#: Windows of more samples per micro-batch than this are not levelled: there the deal levels
#: them already (chat lengths: within 0.01 of the bound), and the work grows with the samples
LEVEL_SAMPLES = 12

#: Passes over the runs' tops: each lowers a top only down to its run's next micro-batch, so
#: the windows keep gaining a little for many passes (bimodal lengths at 128 K, grad-accum 1:
#: 8 passes 1.044x, 32 1.042x, 128 1.040x, 0.029 above the bound)
PASSES = 128

#: Windows of more micro-batches than this are levelled in fewer passes: a pass costs about the
#: bins times the samples; the planner's windows of the default 8 steps stay within it at
#: grad-accum 1 up to dp 16 (an in-memory rollout batch, ``plan_batch``, is not levelled at
#: all: it must take milliseconds)
LEVEL_BINS = 128

#: ... and windows of more than this not at all; those between take :data:`WIDE_PASSES` (the
#: slots of ``--sync micro`` at grad-accum 4 on dp 8, 2 on dp 16: bimodal lengths at 128 K,
#: grad-accum 4, 1.029x -> 1.021x, 0.023 -> 0.016 above the bound; 16 passes 1.4 s for 20 K
#: samples, 128 passes 3.5 s for 1.019x)
WIDE_BINS = 256

WIDE_PASSES = 16


# The slot cut, padded layout (:mod:`varpack.plan.kernels.slots`)

#: A group of four blocks is pooled as one where that lowers its slot time by more than this
#: share (measured at grad-accum 1: nearly every group gains more; none of a band's extra
#: moves for less)
WIDE_GAIN = 0.01


# Bands, padded layout (:mod:`varpack.plan.kernels.bandlevel`)

#: Passes over a block's runs' tops (each move lowers a top only down to its run's next band)
BAND_PASSES = 64


# Blend shares (:mod:`varpack.plan.kernels.shares`)

#: how far (a share of the longer one) a swapped sample's length may be from the other's: the
#: closest first; a step still outside the tolerance tries the next (measured on long-tail,
#: bimodal and uniform sources at 430 K-token steps: 1/32 alone leaves twice the steps out)
LENGTH_SLACK = (1.0 / 32, 1.0 / 8, 1.0 / 4, 1.0 / 2)

#: how many like-sized samples, on each side in length order, a swap looks at (400 leaves a
#: third fewer steps outside, at five times the cost)
NEIGHBOURS = 64

#: how much a swap may lift a rank above its step's costliest rank (a share of that cost)
PEAK_SLACK = 0.01

#: how many swaps one step may take
MAX_SWAPS = 16


# Rollout batches in memory (:mod:`varpack.plan.batch`)

#: Most slots the composer deals at once. Its deal scans every slot of a window per sample: a
#: window of a whole 64 K-sample step (1,600 slots at dp 8) costs 0.21 s, so a step is composed
#: in equal windows of at most this many: 0.04 s, the same balance (64 K samples in 4 steps,
#: time vs ideal under micro sync 1.000108; 1.000103 in windows of 512 slots, 0.09 s). Equal
#: windows matter: windows of 256 slots and a short remainder gave 1.00031
WINDOW_SLOTS = 128

#: Steps are composed from this share of the tokens sorted packing puts in a slot (as offline:
#: the composer then needs a few more slots rarely, fewer never)
STEP_SHARE = 0.98

#: Micro-batches a rank may take beyond the fewest that hold the fullest step's tokens, as a
#: share of them (and one more), before the batch is composed slot by slot instead: dealt
#: costliest first, a step fits in the fewest, or a few more where many samples of over half
#: the budget each leave a micro-batch part empty (responses cut at 8 K, 16 K budget: 84-85
#: where 81 hold the tokens)
MORE_MICRO = 0.05


# The balance engine (:mod:`varpack.plan.engine`, ``--compose engine``)

#: A window's steps are sized for this share of their budget: micro-batches filled to the
#: budget where the samples allow, with a little room for the deal to level bins under it
#: (sized for the whole budget instead: no bench row moves by 0.003; a Pareto tail at 16 K,
#: dp 24, grad-accum 1 0.0002-0.005 slower over four draws, lognormal 64 K lengths at
#: grad-accum 1 0.004 faster: no test shows it yet)
ENGINE_FILL = 0.96

#: Rounds of the improvement search (each gives every group's costliest bin one change; RL
#: rollouts dp 16, grad-accum 2: 16 rounds 1.0066x, 64 rounds 1.0036x)
ENGINE_PASSES = 64

#: How many shorter neighbours, in length order, a trade between groups looks at
TRADE_NEIGHBOURS = 8

#: A group whose costliest bin is within this share of its bins' mean is left as it is
LEVEL_TOLERANCE = 1e-4

#: ... and in a batch planned in memory (``plan_batch(compose="engine")``), within this share:
#: its few steps of thousands of samples each are levelled in milliseconds, and a plain
#: longest-processing-time deal of the same steps levels them to a few 1e-6 under
#: ``sync="step"`` (RL rollouts, 8 K samples, dp 8, 4 steps: baseline 1.0000221x; the engine
#: 1.0000539x at 1e-4, 1.0000105x at 1e-5, 1.0000008x here; 64 K samples: 105-145 ms a batch
#: under step, 154 ms under micro). Offline, 1e-5 already made plans twice as slow for no
#: figure's gain over 0.001.
BATCH_TOLERANCE = 1e-6

#: What a micro-batch costs beyond its samples (its launches and, under FSDP, an all-gather), as
#: a share of a budget-full micro-batch of light samples, where no time model is calibrated:
#: the fixed term of the H100 time fit is about 2 % of a full 16 K micro-batch of a 7B model
#: (34 ms; more of a small model's). The engine adds steps only where they gain more than it
#: (bimodal lengths at 128 K, grad-accum 2: 188 steps where the tokens need 172.7; at 0, 197
#: steps for 0.0003 of time)
MICRO_COST = 0.02


#: each constant -> a test that fails with the constant's rule turned off (its share or count
#: at 0; GROUP_RATIO and WIDE_GAIN at 1.0, which turns them off), found by turning each off
TESTS = {
    "PP_FILL": "tests/plan/kernels/test_compose.py::test_pipeline_steps_are_composed_near_their_whole_budget",
    "MIX_SHARE": "tests/plan/kernels/test_lpt.py::test_rollouts_at_grad_accum_1_mix_better_at_the_same_time",
    "SLOTS_BY_COST": "tests/plan/kernels/test_compose.py::test_rollout_steps_hold_what_their_micro_batches_can_under_step_sync",
    "HEAVY_EXCESS": "tests/plan/kernels/test_compose.py::test_grad_accum_1_stays_near_its_bound",
    "GROUP_RATIO": "tests/plan/kernels/test_compose.py::test_balanced_where_token_composition_is_not",
    "HUNGRY_SHARE": "tests/plan/kernels/test_compose.py::test_hungry_steps_keep_grad_accum_1_within_a_little_of_its_bound",
    "STEP_MOVES": "tests/plan/kernels/test_steplevel.py::test_the_costliest_rank_trades_a_long_sample_for_a_short_one",
    "LEVEL": "tests/plan/kernels/test_steplevel.py::test_a_step_within_its_tolerance_is_left_as_it_is",
    "LEVEL_SAMPLES": "tests/plan/kernels/test_lpt.py::test_the_window_keeps_whichever_deal_waits_less",
    "PASSES": "tests/plan/kernels/test_level.py::test_a_run_top_trades_its_longest_sample_for_a_shorter_one",
    "LEVEL_BINS": "tests/plan/kernels/test_lpt.py::test_the_window_keeps_whichever_deal_waits_less",
    "WIDE_PASSES": "tests/plan/kernels/test_level.py::test_wide_windows_are_levelled_in_fewer_passes",
    "WIDE_BINS": "tests/plan/kernels/test_level.py::test_a_run_top_trades_its_longest_sample_for_a_shorter_one",
    "WIDE_GAIN": "tests/plan/test_padded_micro.py::test_padded_micro_plans_come_near_the_packed_ones",
    "BAND_PASSES": "tests/plan/test_padded_micro.py::test_wide_pooling_and_row_levelling_each_lower_the_time_at_grad_accum_1",
    "MORE_MICRO": "tests/online/test_plan_batch.py::test_a_few_more_micro_batches_where_responses_fill_more_than_half_the_budget",
    "ENGINE_PASSES": "tests/plan/test_engine.py::test_levelling_brings_rollout_steps_to_their_bound",
    "TRADE_NEIGHBOURS": "tests/plan/test_engine.py::test_levelling_brings_rollout_steps_to_their_bound",
    "BATCH_TOLERANCE": "tests/online/test_plan_batch_engine.py::test_ahead_of_a_longest_processing_time_baseline",
    "MICRO_COST": "tests/plan/test_engine.py::test_more_steps_only_where_they_pay_for_their_micro_batches",
    "LEVEL_TOLERANCE": "tests/plan/test_engine.py::test_a_group_within_its_tolerance_is_left_as_it_is",
}  # fmt: skip

#: constants no test fails without yet (each turned off, the plan and online tests all pass):
#: a change to one of them first writes the test that shows what it buys
UNTESTED = ("LENGTH_SLACK", "NEIGHBOURS", "PEAK_SLACK", "MAX_SWAPS",
            "WINDOW_SLOTS", "STEP_SHARE", "ENGINE_FILL")  # fmt: skip

"""The training lab: train the ladder's models on generated tasks, after checking them.

``ladder train`` / ``preflight`` / ``generate`` (``ladder/train.py``) are the way in;
docs/training.md is the chapter. The modules, in the order a run uses them:

* ``levels.common.tasks``: the generated tasks (copy, reverse, cycle);
* ``data``: examples to padded, length-bucketed batches with a scored-target mask;
* ``backend``: how a level computes loss, gradients and the AdamW update
  (torch autograd for levels 2-4, level 1's own backward);
* ``loss``: the masked cross-entropy;
* ``preflight``: four properties checked before any training;
* ``train``: the defaults, the schedule and the loop;
* ``evaluate``: held-out loss, teacher-forced and free-running accuracy;
* ``checkpoint``: atomic, checksummed, ``weights_only``-loadable checkpoints;
* ``inference``: a trained checkpoint loaded at any level, continuing an input.
"""

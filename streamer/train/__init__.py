"""train: the user's model, trained as ``model.fit`` trains it, saved and served.

- ``trainer``: ``Trainer``, Keras' own train step under a tf.distribute strategy, never
  applied when not finite;
- ``model``: the built-in model and loading ``--model package.module:function``;
- ``checkpoint``: model, optimizer, step and stream position in one checkpoint;
- ``export``: SavedModel versions for serving; ``evaluate``: the held-out stream;
- ``nonfinite``: runs of skipped (non-finite) steps;
- ``callbacks``: what happens around a step, in Keras' shape (both loops call one list);
- ``lease``: one worker per checkpoint directory; ``errors``: the errors of training.
"""

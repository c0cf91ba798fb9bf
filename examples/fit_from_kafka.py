"""Your own ``model.fit`` on a Kafka topic, committed only after training (``streamer.Stream``).

    python examples/fit_from_kafka.py                       # the built-in simulator, no Kafka
    python examples/fit_from_kafka.py --bootstrap localhost:9092 --topic samples \\
        --group trainer --checkpoint-dir ckpt --steps-per-epoch 200 --epochs 5

Each fit trains ``steps-per-epoch x epochs`` batches; their records, and only theirs, are
committed to the group (the records read ahead and not trained are read again by the next
run). With ``--checkpoint-dir`` a checkpoint holds the model, its optimizer and the stream
position together, and a second run goes on from it. Keras' own callbacks work beside ours:
here a progress bar, ``EarlyStopping`` and ``TerminateOnNaN``. The model is the one of
``examples/keras_model.py``; any compiled Keras model of the schema's inputs will do.
"""

from __future__ import annotations

import argparse
import logging

import keras

import streamer

try:
    from examples.keras_model import build
except ModuleNotFoundError:  # run as a script: examples/ is the path's first entry
    from keras_model import build  # type: ignore[import-not-found,no-redef]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (unset: the simulator)")
    parser.add_argument("--topic", default="samples")
    parser.add_argument("--group", default="trainer")
    parser.add_argument("--schema", help="the records' schema file (unset: the simulator's)")
    parser.add_argument("--checkpoint-dir", help="model + optimizer + stream position")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps-per-epoch", type=int, default=100)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    with streamer.Stream(
        bootstrap=args.bootstrap,
        topic=args.topic,
        group=args.group,
        schema=args.schema,
        checkpoint_dir=args.checkpoint_dir,
        batch_size=args.batch_size,
        metrics_port=args.metrics_port,
    ) as stream:
        model = build(stream.schema)  # compiled, as for `streamer run --model`
        model.fit(
            stream.dataset(model),
            steps_per_epoch=args.steps_per_epoch,
            epochs=args.epochs,
            callbacks=[
                stream.callback(),
                keras.callbacks.EarlyStopping(monitor="loss", patience=2),
                keras.callbacks.TerminateOnNaN(),
            ],
            verbose=2,
        )
        print(f"trained {stream.step} steps; position {stream.position()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

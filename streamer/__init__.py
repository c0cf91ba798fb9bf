"""streamer: Kafka msgpack records -> tf.data -> continuous TensorFlow training, with metrics."""

__version__ = "0.1.0"

__all__ = ["__version__"]

"""decode: msgpack records to columns, by a schema; pure (numpy and msgpack only).

- ``schema``, ``feature``: the record schema, its features and the decoder's limits;
- ``records``: ``decode_block`` (one block of records to one array per feature, bad records
  set aside with a reason), ``encode_record``, ``explain_reject``;
- ``values``: one feature value at a time, the dtype rules, column assembly;
- ``columns``, ``ragged``: the decoded block as tf.data outputs and back; ragged columns.
"""

from streamer.decode.records import (
    REASONS,
    DecodedBlock,
    Reason,
    decode_block,
    encode_record,
    explain_reject,
)
from streamer.decode.schema import Feature, Schema

__all__ = [
    "REASONS",
    "DecodedBlock",
    "Feature",
    "Reason",
    "Schema",
    "decode_block",
    "encode_record",
    "explain_reject",
]

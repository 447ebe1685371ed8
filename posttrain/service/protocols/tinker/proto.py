"""The two protobuf payloads of the tinker SDK's wire protocol (SDK 0.38), both directions.

Since SDK 0.25 a ``forward_backward`` request travels as a protobuf
``ForwardBackwardRequest``, and the results of ``forward_backward``, ``forward`` and
``asample`` must come back as protobuf ``ForwardBackwardOutput`` / ``SampleResponse``
(a JSON result is refused by the SDK). The schema is the SDK's own generated module
(``tinker.proto.tinker_public_pb2``), imported at run time so the field numbers are
exactly the SDK's; the layouts below mirror the SDK's codecs,
``tinker/proto/request_conv.py`` (what it writes) and ``response_conv.py`` (what it reads):

- tokens of a text chunk: little-endian int32 bytes;
- a dense tensor: the values' bytes in its dtype (float32 or int64) plus its shape;
- ``ForwardBackwardOutput``: one ``ArrayRecord`` whose ``logprobs`` field is a
  ``BatchedTensor``: every datum's float32 values concatenated, with ``n + 1`` int64
  *byte* offsets; metric keys are ``name:reduction`` (the SDK splits them on ``:``);
- ``SampleResponse``: per sequence a stop reason (``STOP`` / ``LENGTH``), int32 tokens and
  float32 logprobs; ``prompt_logprobs`` float32 with NaN where there is none (position 0).

What this server does not take is refused here with the field named, never dropped:
sparse (CSR) tensors, image and audio chunks, tensors of more than one dimension, dtypes
other than float32/int64. Provenance spans are not read: only ``stable_reinforce`` uses
them, and that loss is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# a zstd body may not expand past this (the SDK compresses only when the server asks,
# and this server does not; a compressed body is still accepted, within this bound)
MAX_DECOMPRESSED_BYTES = 256 << 20


class ProtoError(ValueError):
    """A protobuf body this server cannot take; the message names the field."""


@dataclass(frozen=True)
class WireDatum:
    """One datum of a forward_backward request: input tokens and flat per-token inputs."""

    token_ids: list[int]
    loss_fn_inputs: dict[str, list[Any]]  # ints for int64 tensors, floats for float32


@dataclass(frozen=True)
class ForwardBackwardWire:
    """A decoded ``ForwardBackwardRequest``."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[WireDatum]


def _schema() -> Any:
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


def _decompress(body: bytes, content_encoding: str | None) -> bytes:
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding != "zstd":
        raise ProtoError(f"Content-Encoding {content_encoding!r} is not supported; send zstd "
                         "or an uncompressed body")
    import zstandard

    try:
        return zstandard.ZstdDecompressor().decompress(
            body, max_output_size=MAX_DECOMPRESSED_BYTES)
    except zstandard.ZstdError as error:
        raise ProtoError(f"body: not valid zstd ({error})") from None


def _tensor_values(tensor: Any, where: str) -> list[Any]:
    import numpy as np

    pb = _schema()
    if tensor.WhichOneof("encoding") == "sparse_csr":
        raise ProtoError(f"{where}: sparse (CSR) tensors are not supported by this server; "
                         "send it dense")
    numpy_dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}.get(tensor.dtype)
    if numpy_dtype is None:
        raise ProtoError(f"{where}: dtype {pb.DType.Name(tensor.dtype)} is not supported; "
                         "per-token inputs are float32 or int64")
    if len(tensor.dense) % np.dtype(numpy_dtype).itemsize:
        raise ProtoError(f"{where}: {len(tensor.dense)} bytes is not a whole number of "
                         f"{np.dtype(numpy_dtype).name} values")
    values = np.frombuffer(tensor.dense, dtype=numpy_dtype)
    shape = list(tensor.shape)
    if shape:
        if math.prod(shape) != values.size:
            raise ProtoError(f"{where}: shape {shape} does not hold its {values.size} values")
        if len(shape) != 1:
            raise ProtoError(f"{where}: shape {shape}; per-token inputs are 1-D, one value "
                             "per input token")
    return values.tolist()


def _datum(message: Any, where: str) -> WireDatum:
    import numpy as np

    tokens: list[int] = []
    for index, chunk in enumerate(message.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise ProtoError(f"{where}.model_input[{index}]: {kind or 'empty'} chunks are not "
                             "supported; this server trains a text model (token chunks only)")
        if len(chunk.encoded_text.tokens) % 4:
            raise ProtoError(f"{where}.model_input[{index}]: tokens are not whole int32 values")
        tokens.extend(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist())
    inputs = {name: _tensor_values(tensor, f"{where}.loss_fn_inputs.{name}")
              for name, tensor in message.loss_fn_inputs.items()}
    return WireDatum(token_ids=tokens, loss_fn_inputs=inputs)


def _loss_config(message: Any) -> dict[str, float | str]:
    # the SDK writes numbers to both maps and text only to v2; v2 wins when present
    if message.loss_fn_config_v2:
        config: dict[str, float | str] = {}
        for key, value in message.loss_fn_config_v2.items():
            config[key] = value.text if value.WhichOneof("value") == "text" else value.number
        return config
    return {key: float(value) for key, value in message.loss_fn_config.items()}


def read_forward_backward(body: bytes, content_encoding: str | None = None) -> Any:
    """The ``ForwardBackwardRequest`` message of a request body (protobuf, optionally zstd).

    Its ``model_id`` and ``seq_id`` can be read even when ``forward_backward_wire`` then
    refuses its content. Raises ``ProtoError`` when the body is not such a message."""
    from google.protobuf.message import DecodeError

    message = _schema().ForwardBackwardRequest()
    try:
        message.ParseFromString(_decompress(body, content_encoding))
    except DecodeError as error:
        raise ProtoError(f"body: not a tinker ForwardBackwardRequest protobuf ({error})"
                         ) from None
    return message


def forward_backward_wire(message: Any) -> ForwardBackwardWire:
    """A ``ForwardBackwardRequest`` message as plain values; ``ProtoError`` naming the field
    for anything this server does not take."""
    return ForwardBackwardWire(
        model_id=message.model_id,
        seq_id=int(message.seq_id),
        loss_fn=message.loss_fn,
        loss_fn_config=_loss_config(message),
        forward_only=bool(message.forward_only),
        data=[_datum(datum, f"data[{index}]") for index, datum in enumerate(message.data)],
    )


def decode_forward_backward(body: bytes, content_encoding: str | None = None
                            ) -> ForwardBackwardWire:
    """``read_forward_backward`` then ``forward_backward_wire``."""
    return forward_backward_wire(read_forward_backward(body, content_encoding))


def encode_forward_backward_output(logprobs: list[list[float]], metrics: dict[str, float]
                                   ) -> bytes:
    """A ``ForwardBackwardOutput``: per datum its target-token ``logprobs`` (float32), and
    ``metrics`` (every key must read ``name:reduction``)."""
    import numpy as np

    pb = _schema()
    bad = [key for key in metrics if key.count(":") != 1]
    if bad:
        raise ValueError(f"metric keys must be name:reduction, got {bad}")
    arrays = [np.asarray(values, dtype=np.float32) for values in logprobs]
    offsets = np.cumsum([0] + [array.nbytes for array in arrays], dtype=np.int64)
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    record = output.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(arrays))
    field = record.fields["logprobs"]
    field.data = b"".join(array.tobytes() for array in arrays)
    field.offsets = offsets.tobytes()
    field.dtype = pb.DTYPE_FLOAT32
    for key, value in metrics.items():
        output.metrics[key] = float(value)
    return output.SerializeToString()


@dataclass(frozen=True)
class SampledSequenceWire:
    """One sampled sequence: whether it stopped (``True``) or ran out of tokens."""

    stopped: bool
    tokens: list[int]
    logprobs: list[float]


def encode_sample_response(sequences: list[SampledSequenceWire],
                           prompt_logprobs: list[float | None] | None = None) -> bytes:
    """A ``SampleResponse``; ``prompt_logprobs`` (None: not asked for) has one entry per
    prompt token, None where there is no value (sent as NaN, as the SDK expects)."""
    import numpy as np

    pb = _schema()
    response = pb.SampleResponse()
    for sequence in sequences:
        response.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if sequence.stopped else pb.STOP_REASON_LENGTH,
            tokens=np.asarray(sequence.tokens, dtype=np.int32).tobytes(),
            logprobs=np.asarray(sequence.logprobs, dtype=np.float32).tobytes(),
        )
    if prompt_logprobs is not None:
        values = [math.nan if value is None else value for value in prompt_logprobs]
        response.prompt_logprobs = np.asarray(values, dtype=np.float32).tobytes()
    return response.SerializeToString()

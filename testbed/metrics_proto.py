"""client_model's metrics.proto as google.protobuf message classes, built from
a descriptor at run time (no protoc): what the tests decode the agent's
protobuf exposition with, and what bench/protobuf_encoding measures the
hand-written encoder against."""
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# "*" marks a repeated field; a capitalised type is a message of this file,
# except the MetricType enum.
SCHEMA = {
    "LabelPair": [("name", 1, "string"), ("value", 2, "string")],
    "Gauge": [("value", 1, "double")],
    "Counter": [("value", 1, "double")],
    "Untyped": [("value", 1, "double")],
    "Quantile": [("quantile", 1, "double"), ("value", 2, "double")],
    "Summary": [("sample_count", 1, "uint64"), ("sample_sum", 2, "double"),
                ("quantile", 3, "*Quantile")],
    "Bucket": [("cumulative_count", 1, "uint64"), ("upper_bound", 2, "double")],
    "BucketSpan": [("offset", 1, "sint32"), ("length", 2, "uint32")],
    "Histogram": [
        ("sample_count", 1, "uint64"), ("sample_count_float", 4, "double"),
        ("sample_sum", 2, "double"), ("bucket", 3, "*Bucket"), ("schema", 5, "sint32"),
        ("zero_threshold", 6, "double"), ("zero_count", 7, "uint64"),
        ("zero_count_float", 8, "double"), ("negative_span", 9, "*BucketSpan"),
        ("negative_delta", 10, "*sint64"), ("negative_count", 11, "*double"),
        ("positive_span", 12, "*BucketSpan"), ("positive_delta", 13, "*sint64"),
        ("positive_count", 14, "*double")],
    "Metric": [("label", 1, "*LabelPair"), ("gauge", 2, "Gauge"), ("counter", 3, "Counter"),
               ("summary", 4, "Summary"), ("untyped", 5, "Untyped"),
               ("histogram", 7, "Histogram"), ("timestamp_ms", 6, "int64")],
    "MetricFamily": [("name", 1, "string"), ("help", 2, "string"), ("type", 3, "MetricType"),
                     ("metric", 4, "*Metric")],
}
TYPES = ["COUNTER", "GAUGE", "SUMMARY", "UNTYPED", "HISTOGRAM", "GAUGE_HISTOGRAM"]


def message_classes() -> dict:
    """Message name -> its google.protobuf class."""
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tracehound_test/metrics.proto", package="io.prometheus.client", syntax="proto2")
    enum = proto.enum_type.add(name="MetricType")
    for number, name in enumerate(TYPES):
        enum.value.add(name=name, number=number)
    for message, fields in SCHEMA.items():
        msg = proto.message_type.add(name=message)
        for name, number, kind in fields:
            repeated = kind.startswith("*")
            kind = kind.lstrip("*")
            field = msg.field.add(name=name, number=number,
                                  label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if kind == "MetricType":
                field.type, field.type_name = F.TYPE_ENUM, ".io.prometheus.client.MetricType"
            elif kind[0].isupper():
                field.type, field.type_name = F.TYPE_MESSAGE, ".io.prometheus.client." + kind
            else:
                field.type = getattr(F, "TYPE_" + kind.upper())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(
        pool.FindMessageTypeByName("io.prometheus.client." + name)) for name in SCHEMA}


def read_varint(data: bytes, pos: int = 0) -> tuple[int, int]:
    """The varint at POS, and the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos

"""The protobuf exposition, two encoders: python -m bench.protobuf_encoding."""

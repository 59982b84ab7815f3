"""What counting io_uring, AIO and copies costs: python -m bench.async_cost."""

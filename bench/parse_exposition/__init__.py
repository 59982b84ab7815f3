"""Reading a 5 MB exposition, two parsers: python -m bench.parse_exposition."""

"""Thin Python layer over the system libbpf."""

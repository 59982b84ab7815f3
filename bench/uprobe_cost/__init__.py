"""The application view's uprobes on a verb, natively: python -m bench.uprobe_cost."""

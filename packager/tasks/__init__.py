"""A part's task: declared (--task), suggested from the graph, judged in its terms."""

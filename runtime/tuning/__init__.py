"""`hlopt tune`: the search, its space, and the files a run leaves."""

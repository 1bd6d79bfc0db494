"""``anonml bench NAME``: one benchmark per component, each printing its
figures beside a baseline measured in the same run (DESIGN.md §11)."""

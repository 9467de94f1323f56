"""obshub streams stage."""

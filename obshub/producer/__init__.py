"""obshub producer stage."""

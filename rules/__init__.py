"""obshub rules stage."""

"""obshub bench stage."""

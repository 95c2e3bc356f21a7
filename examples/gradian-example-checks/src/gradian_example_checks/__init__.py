"""A worked example of Gradian plug-ins: one capability (`yes_no`) and one audit check (`todo_in_answer`)."""

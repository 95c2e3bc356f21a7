"""Speed and memory measurements of Gradian's passes, each printing a markdown table."""

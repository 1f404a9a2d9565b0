"""One module per CLI command: HELP, add_arguments(parser), main(args) -> int."""

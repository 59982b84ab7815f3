"""The command line's sub-commands. Each module here, and the command
modules of the top and chaos packages, has add_parser(subparsers, hook)
that registers its sub-command with set_defaults(handler=fn); fn(args)
returns the exit code. Keep their imports light: they run for every
command line."""

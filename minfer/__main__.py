from minfer.cli import main

raise SystemExit(main())

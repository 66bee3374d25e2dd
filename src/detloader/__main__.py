from detloader.cli import main

raise SystemExit(main())

from opscope.app.cli import main

main()

from opscope.app.entry import main

main()

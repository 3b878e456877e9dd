# The teacher of distillation: its model from a checkpoint (src/sinew/distill/teacher_model.*) and the gRPC
# service over it (src/sinew/serve/teacher_*), in process on 127.0.0.1 (teacher_test.cpp); and the
# sinew-teacher command line (teacher_cli.sh: usage errors, exit codes, a serve run ended by SIGTERM).
add_test(NAME serve.teacher COMMAND sinew_serve_tests --gtest_filter=Teacher*)
set_tests_properties(serve.teacher PROPERTIES TIMEOUT 180 LABELS "serve")
if(TARGET sinew-teacher AND TARGET sinew-train)
  add_test(NAME cli.teacher_bad_input
           COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/teacher_cli.sh $<TARGET_FILE:sinew-teacher>
                   $<TARGET_FILE:sinew-train> ${CMAKE_CURRENT_BINARY_DIR}/teacher_cli)
  set_tests_properties(cli.teacher_bad_input PROPERTIES TIMEOUT 180 LABELS "cli;serve" SKIP_RETURN_CODE 77)
endif()

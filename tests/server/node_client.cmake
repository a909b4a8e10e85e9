# The OpenAI Node client test (tests/server/node/openai_client.cjs, driven by
# node_client_test.cpp): a CTest fixture installs the pinned npm package `openai` into the build
# tree, then test_server runs the node script against a live loopback server. Needs node and npm
# (Debian's nodejs / npm; Node 20 works with this version) and the npm registry at set-up.
find_program(PAGEDATTN_NODE node)
find_program(PAGEDATTN_NPM npm)
if(NOT PAGEDATTN_NODE OR NOT PAGEDATTN_NPM)
  message(STATUS "node / npm not found: the OpenAI Node client test is not registered")
  return()
endif()
set(PAGEDATTN_OPENAI_NODE_VERSION 4.95.0)
set(node_prefix ${PROJECT_BINARY_DIR}/test-node)
add_test(NAME server_node_setup
         COMMAND ${PAGEDATTN_NPM} install --prefix ${node_prefix} --no-audit --no-fund
                 --loglevel=error openai@${PAGEDATTN_OPENAI_NODE_VERSION})
set_tests_properties(server_node_setup PROPERTIES FIXTURES_SETUP openai_node TIMEOUT 300
                                                  LABELS server)
add_test(NAME server_openai_node_client
         COMMAND test_server --gtest_filter=OpenAiNodeClient.*)
set_tests_properties(server_openai_node_client PROPERTIES
  FIXTURES_REQUIRED openai_node
  TIMEOUT 120
  LABELS server
  ENVIRONMENT "PAGEDATTN_OPENAI_NODE=${node_prefix}/node_modules/openai;PAGEDATTN_NODE=${PAGEDATTN_NODE};PAGEDATTN_NODE_SCRIPT=${CMAKE_CURRENT_LIST_DIR}/node/openai_client.cjs")

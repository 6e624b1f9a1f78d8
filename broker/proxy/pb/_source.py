"""Written by broker/proxy/protos/generate.py: what the modules beside it were generated from."""
GENERATOR = 'grpcio-tools==1.85.1'
PROTO_SHA256 = {
    'definition.proto': '5b8b2bbe2f39f714ac57a464e07eb9915065ed5e54cd404451cceb62d55be2a7',
    'service.proto': '6c2ab86232d852b9bb1aeba610e9bf7187c97145d389142e5d18e95582e4807b',
}

package main

// The gRPC side of kvserver, for the GRPCRoute tests: a real gRPC server (grpc-go) on the
// same port as the HTTP API, over plaintext HTTP/2 as a gateway speaks to it (h2c, prior
// knowledge).
//
//	linnet.kv.Kv/Image  (google.protobuf.StringValue) -> StringValue: the image's name, as GET /
//	                    does; UNAVAILABLE with the name for an image built to fail its requests
//
// The messages are protobuf's well-known StringValue, so the service needs no generated code.

import (
	"context"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type imageServer struct {
	image string
	fail  bool
}

func (s *imageServer) Image(_ context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	if s.fail {
		return nil, status.Error(codes.Unavailable, s.image)
	}
	return wrapperspb.String(s.image), nil
}

type imageService interface {
	Image(context.Context, *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
}

var kvServiceDesc = grpc.ServiceDesc{
	ServiceName: "linnet.kv.Kv",
	HandlerType: (*imageService)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Image",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(imageService).Image(ctx, in)
		},
	}},
	Streams:  []grpc.StreamDesc{},
	Metadata: "linnet/kv.proto",
}

// grpcServer serves linnet.kv.Kv.
func grpcServer(image string, fail bool) *grpc.Server {
	g := grpc.NewServer()
	g.RegisterService(&kvServiceDesc, &imageServer{image: image, fail: fail})
	return g
}

// withGRPC sends gRPC requests (HTTP/2, content-type application/grpc) to g and every other
// request to rest.
func withGRPC(g *grpc.Server, rest http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			g.ServeHTTP(w, r)
			return
		}
		rest.ServeHTTP(w, r)
	})
}

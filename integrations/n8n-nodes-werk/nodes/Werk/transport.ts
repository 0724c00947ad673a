import type {
	IDataObject,
	IExecuteFunctions,
	IHttpRequestMethods,
	IHttpRequestOptions,
	ILoadOptionsFunctions,
	ISupplyDataFunctions,
	JsonObject,
} from 'n8n-workflow';
import { NodeApiError, NodeOperationError } from 'n8n-workflow';

/** The credential's fields, as the node reads them. */
export interface WerkCredentials {
	baseUrl: string;
	apiKey?: string;
	allowExperimental?: boolean;
}

type Context = IExecuteFunctions | ILoadOptionsFunctions | ISupplyDataFunctions;

const TOKEN = /wh_[A-Za-z0-9_-]+/g;

/** Any handoff token in `text` replaced by `wh_…`: no message of this node carries one. */
export function redact(text: string): string {
	return text.replace(TOKEN, 'wh_…');
}

export async function credentials(ctx: Context): Promise<WerkCredentials> {
	const found = (await ctx.getCredentials('werkApi')) as unknown as WerkCredentials;
	return {
		...found,
		baseUrl: String(found.baseUrl || 'http://127.0.0.1:11434').replace(/\/+$/, ''),
	};
}

/**
 * One JSON request to Werk with the credential's key. A Werk error (`{"error": {"code",
 * "message"}}`) becomes a NodeApiError carrying Werk's message and code, never a token.
 */
export async function werkRequest(
	ctx: Context,
	method: IHttpRequestMethods,
	path: string,
	body?: IDataObject,
	qs?: IDataObject,
): Promise<IDataObject> {
	const { baseUrl } = await credentials(ctx);
	const options: IHttpRequestOptions = { method, url: `${baseUrl}${path}`, json: true };
	if (body !== undefined) options.body = body;
	if (qs !== undefined) options.qs = qs;
	try {
		return (await ctx.helpers.httpRequestWithAuthentication.call(
			ctx,
			'werkApi',
			options,
		)) as IDataObject;
	} catch (error) {
		throw werkError(ctx, error);
	}
}

/** The bytes at a Werk path or signed output link, with the credential's key. */
export async function werkDownload(ctx: IExecuteFunctions, url: string): Promise<Buffer> {
	const { baseUrl } = await credentials(ctx);
	const options: IHttpRequestOptions = {
		method: 'GET',
		url: url.startsWith('/') ? `${baseUrl}${url}` : url,
		encoding: 'arraybuffer',
		json: false,
	};
	try {
		const data = await ctx.helpers.httpRequestWithAuthentication.call(ctx, 'werkApi', options);
		return Buffer.from(data as ArrayBuffer);
	} catch (error) {
		throw werkError(ctx, error);
	}
}

function werkError(ctx: Context, error: unknown): Error {
	// n8n-core wraps a failed request in a NodeApiError: the response body is in its
	// `context.data` and the status in `httpCode`; a raw HTTP error carries `response`.
	const failed = error as {
		message?: string;
		httpCode?: string | null;
		context?: { data?: unknown };
		response?: { status?: number; data?: unknown };
	};
	const response = failed.response;
	let data = response?.data ?? failed.context?.data;
	if (typeof data === 'string') {
		try {
			data = JSON.parse(data);
		} catch {
			data = undefined;
		}
	}
	const werk = (data as { error?: { code?: string; message?: string } } | undefined)?.error;
	const status = response?.status ?? (Number(failed.httpCode) || undefined);
	if (werk?.message) {
		const message = redact(`Werk: ${werk.message} (${werk.code ?? 'error'})`);
		return new NodeApiError(ctx.getNode(), { code: werk.code ?? '' } as JsonObject, {
			message,
			description: redact(werk.message),
			httpCode: status ? String(status) : undefined,
		});
	}
	return new NodeOperationError(
		ctx.getNode(),
		redact(`Werk did not answer as expected: ${failed.message ?? String(error)}`),
	);
}
